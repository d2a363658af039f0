"""Layer-skip self-speculation on tiny random models: exactness, KV sharing, errors, sampling, tuning."""

import json

import pytest
import torch

import specdec.sampling.verify as engine_module
from specdec.config import GenerationConfig, SamplingParams
from specdec.drafters.base import Capabilities, DraftState, NoDrafter
from specdec.drafters.layer_skip import LayerSkipDrafter, load_choice, make_layer_skip, parse_layer_spec, save_choice
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from specdec.model.partial import embed, forward_from_layer, forward_layers, head
from specdec.tune_layer_skip import default_candidates, tune_layer_skip
from tests.conftest import tiny_model
from tests.test_engine import N_TRIALS, PROMPTS, SMALL_VOCAB, exact_joint, tv, tv_bound

N_LAYERS = 4
MODES = ("own", "shared", "shared-verify")  # own cache; target's cache; target's cache + verify from layer L


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models are all per-call overhead: one intra-op thread is as fast and leaves the other core idle."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def deep_target():
    return tiny_model(0, num_layers=N_LAYERS)


@pytest.fixture(scope="module")
def deep_plain(deep_target):
    engine = Engine.single(deep_target, NoDrafter(), 256)
    return [engine.generate(p, GenerationConfig(24, 4)).tokens for p in PROMPTS]


def layer_skip_engine(target, layers, mode, capacity=256, monkeypatch=None, policy=None):
    """An engine with a LayerSkipDrafter in `mode`: 'own' cache, 'shared' target cache with a full
    verify pass, or 'shared-verify' (the engine's verify starts at layer L from the drafter's states)."""
    drafter = LayerSkipDrafter(target, layers, capacity)
    engine = Engine.single(target, drafter, capacity, policy=policy)
    if mode != "own":
        assert drafter.share_target_cache(engine.cache) is drafter
    if mode == "shared":  # the engine calls drafter.verify when its caps say so; this mode opts out
        drafter.caps = Capabilities()
    return engine, drafter


@pytest.mark.parametrize("layers, k, mode", [(L, k, mode) for L, k in ((1, 4), (2, 1), (3, 6)) for mode in MODES]
                         + [([0, 2], 3, "own"), ([1, 3], 4, "own")])  # a subset keeps its own cache
def test_greedy_equivalence(deep_target, deep_plain, monkeypatch, layers, k, mode):
    engine, drafter = layer_skip_engine(deep_target, layers, mode, monkeypatch=monkeypatch)
    for prompt, expected in zip(PROMPTS, deep_plain):
        result = engine.generate(prompt, GenerationConfig(24, k))
        assert result.tokens == expected, f"layers={layers} k={k} {mode} diverged on {prompt}"
        assert result.stats.drafted > 0


def test_two_layer_model_and_eos(tiny_target, monkeypatch):
    plain = Engine.single(tiny_target, NoDrafter(), 256).generate(PROMPTS[0], GenerationConfig(30, 4)).tokens
    eos = plain[9]
    engine, _ = layer_skip_engine(tiny_target, 1, "shared-verify", monkeypatch=monkeypatch)
    assert engine.generate(PROMPTS[0], GenerationConfig(30, 4)).tokens == plain
    result = engine.generate(PROMPTS[0], GenerationConfig(30, 4), eos_ids={eos})
    assert result.tokens == plain[:plain.index(eos) + 1] and result.finish_reason == "stop"


def test_near_capacity_and_adaptive_k_stay_exact(deep_target, monkeypatch):
    from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig
    prompt = list(range(20))
    expected = Engine.single(deep_target, NoDrafter(), 28).generate(prompt, GenerationConfig(8, 1)).tokens
    for mode in MODES:
        engine, _ = layer_skip_engine(deep_target, 2, mode, capacity=28, monkeypatch=monkeypatch)
        assert engine.generate(prompt, GenerationConfig(8, 6)).tokens == expected, mode
    # k varies per step, including plain steps (k = 0) where the drafter is not asked
    policy = AdaptivePolicy(CostModel({1: 1.0, 9: 3.0}, 0.5), PolicyConfig(k_max=4, probe_every=2))
    engine, _ = layer_skip_engine(deep_target, 2, "shared-verify", monkeypatch=monkeypatch, policy=policy)
    result = engine.generate(PROMPTS[2], GenerationConfig(40, 4))
    plain = Engine.single(deep_target, NoDrafter(), 256).generate(PROMPTS[2], GenerationConfig(40, 4)).tokens
    assert result.tokens == plain


def test_all_but_last_layer_is_mostly_accepted():
    """Sanity: when the skipped last layer barely moves the residual stream, its drafts pass."""
    target = tiny_model(4, num_layers=3)
    with torch.no_grad():
        last = target.model.layers[-1]
        last.self_attn.o_proj.weight.mul_(0.02)
        last.mlp.down_proj.weight.mul_(0.02)
    engine, _ = layer_skip_engine(target, 2, "shared")
    stats = [engine.generate(p, GenerationConfig(40, 4)).stats for p in PROMPTS]
    assert sum(s.accepted for s in stats) / sum(s.drafted for s in stats) > 0.9
    assert all(s.tau > 3.5 for s in stats)


def test_shares_weights_and_keeps_a_small_cache(deep_target):
    drafter = LayerSkipDrafter(deep_target, [0, 2], 64)
    assert drafter.target is deep_target and drafter.cache.k.shape[0] == 2 and drafter.spec == [0, 2]
    assert LayerSkipDrafter(deep_target, [0, 1], 64).spec == 2  # a prefix is L
    engine, shared = layer_skip_engine(deep_target, 3, "shared", capacity=64)
    assert shared.cache is None and shared.shared is engine.cache
    assert make_layer_skip(deep_target, [0, 2], 64, engine.cache).shared is None  # a subset keeps its own
    assert make_layer_skip(deep_target, 2, 64, engine.cache).shared is engine.cache
    assert make_layer_skip(deep_target, [0, 1], 64, engine.cache).shared is engine.cache
    assert LayerSkipDrafter(deep_target, 1, 64, cache=engine.cache).cache is None  # nothing allocated


@pytest.mark.parametrize("bad", [0, N_LAYERS, -1, N_LAYERS + 3, [], [2, 1], [0, 0], [0, N_LAYERS], [-1, 2],
                                 list(range(N_LAYERS)), True, [0.5], "2"])
def test_invalid_layers_are_clear_errors(deep_target, bad):
    with pytest.raises(SpecdecError, match="layer"):
        LayerSkipDrafter(deep_target, bad, 64)


def test_other_errors(deep_target):
    with pytest.raises(SpecdecError, match="at least 2 layers"):
        LayerSkipDrafter(tiny_model(0, num_layers=1), 1, 64)
    with pytest.raises(SpecdecError, match="1..3"):
        LayerSkipDrafter(deep_target, 4, 64)
    with pytest.raises(SpecdecError, match="0..L-1"):
        LayerSkipDrafter(deep_target, [1, 2], 64).share_target_cache(deep_target.new_cache(64))
    with pytest.raises(SpecdecError, match="target's KV cache"):
        LayerSkipDrafter(deep_target, 2, 64).share_target_cache(tiny_model(0).new_cache(64))
    assert parse_layer_spec("8") == 8 and parse_layer_spec("0-3,6") == [0, 1, 2, 3, 6]
    assert parse_layer_spec(" auto ") == "auto"
    with pytest.raises(SpecdecError, match="--layer-skip"):
        parse_layer_spec("first")
    with pytest.raises(SpecdecError, match="1..3"):
        tune_layer_skip(deep_target, [PROMPTS[0]], candidates=[5])
    with pytest.raises(SpecdecError, match="prompt"):
        tune_layer_skip(deep_target, [], candidates=[1])


@pytest.mark.parametrize("mode", ["shared", "shared-verify"])
def test_shared_cache_is_exact_and_never_refeeds(deep_target, monkeypatch, mode):
    engine, drafter = layer_skip_engine(deep_target, 2, mode, monkeypatch=monkeypatch)
    prompt = PROMPTS[2]
    result = engine.generate(prompt, GenerationConfig(30, 3))
    committed = prompt + result.tokens[:-1]  # the last new token is not in the cache yet
    assert engine.cache.length == len(committed)
    fresh = deep_target.new_cache(64)
    deep_target(torch.tensor([committed]), fresh, 0)
    n = len(committed)
    for name in ("k", "v"):
        got, want = getattr(engine.cache, name)[:, :, :, :n], getattr(fresh, name)[:, :, :, :n]
        # every layer, the shared ones included; as close as plain decoding's own cache is to one
        # full forward (one-token vs many-token GEMMs round differently: about 2e-5 here on values up to 10)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-4), name
    # the prompt and accepted tokens never pass through the draft layers: each step feeds the last
    # committed token + k - 1 drafts (+ the last draft when verify starts at layer L)
    s = result.stats
    assert drafter.tokens_fed == s.drafted + (s.steps - s.k_chosen[0] if mode == "shared-verify" else 0)
    own_engine, own = layer_skip_engine(deep_target, 2, "own")
    assert own_engine.generate(prompt, GenerationConfig(30, 3)).tokens == result.tokens
    assert own.tokens_fed >= len(prompt) + s.drafted  # the own-cache drafter prefills the prompt itself


def test_verify_from_layer_falls_back_when_it_cannot_reuse(deep_target):
    """A verify of anything but the drafter's last proposal runs the full target forward."""
    engine, drafter = layer_skip_engine(deep_target, 2, "shared-verify", capacity=64)
    sampling = SamplingParams()
    deep_target(torch.tensor([PROMPTS[0]]), engine.cache, 0)  # the prompt prefilled
    engine.cache.advance(len(PROMPTS[0]))
    tokens = PROMPTS[0] + [7]
    tree = drafter.propose(DraftState(tokens, 3, sampling, None))
    other = type(tree).chain(torch.tensor([1, 2, 3]))
    ref_cache = deep_target.new_cache(64)
    deep_target(torch.tensor([PROMPTS[0]]), ref_cache, 0)
    ref_cache.advance(len(PROMPTS[0]))
    want = engine_module.verify(deep_target, ref_cache, 7, other, sampling, None)
    got = drafter.verify(deep_target, engine.cache, 7, other, sampling, None)
    assert (got.num_accepted, got.next_token) == (want.num_accepted, want.next_token)
    assert drafter.verify_hidden(engine.cache, 7, tree) is None  # a proposal is used once


@pytest.mark.parametrize("first_layer", range(N_LAYERS + 1))
def test_forward_from_layer_is_the_rest_of_the_forward(deep_target, first_layer):
    full, split = deep_target.new_cache(32), deep_target.new_cache(32)
    prompt, more = torch.tensor([PROMPTS[0] + [9, 9]]), torch.tensor([[4, 8, 15, 16]])
    want = [deep_target(prompt, full, 0), deep_target(more, full, 7)]
    got = []
    for x, start in ((prompt, 0), (more, 7)):
        hidden = forward_layers(deep_target, embed(deep_target, x), split, start, list(range(first_layer)))
        got.append(forward_from_layer(deep_target, hidden, split, start, first_layer))
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert torch.equal(full.k[:, :, :, :11], split.k[:, :, :, :11]) and torch.equal(full.v, split.v)
    hidden = forward_layers(deep_target, embed(deep_target, prompt), split, 0, list(range(first_layer)))
    last = forward_from_layer(deep_target, hidden, split, 0, first_layer, last_only=True)
    assert torch.equal(last, deep_target(prompt, deep_target.new_cache(32), 0, last_only=True))


def layer_skip_joint(target, layers, prompt, n, sampling):
    """The draft's own joint P(t1..tn | prompt) over SMALL_VOCAB, for the power check."""
    import itertools
    import math
    from specdec.sampling.logits import probs_from_logits
    joint = {}
    for seq in itertools.product(range(SMALL_VOCAB), repeat=n):
        x = torch.tensor([prompt + list(seq)])
        logits = head(target, forward_layers(target, embed(target, x), target.new_cache(64), 0, layers))[0]
        probs = probs_from_logits(logits, sampling)
        joint[seq] = math.prod(probs[r, t].item() for r, t in zip(range(len(prompt) - 1, len(prompt) - 1 + n), seq))
    return joint


def sample_first3(engine, prompt, sampling):
    """tests.test_engine.sample_first3 on a given engine (a shared drafter is bound to its cache)."""
    counts = {}
    for seed in range(N_TRIALS):
        cfg = GenerationConfig(4, 3, SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, seed))
        seq = tuple(engine.generate(prompt, cfg).tokens[:3])
        counts[seq] = counts.get(seq, 0) + 1
    return counts


@pytest.mark.parametrize("sampling, modes", [(SamplingParams(1.0), ("shared-verify",)),
                                             (SamplingParams(0.7, top_k=2, top_p=0.9), ("own",))])
def test_sampling_matches_target_distribution(monkeypatch, sampling, modes):
    """The first 3 tokens follow the target's exact joint; tokens 2 and 3 come from verifying a draft."""
    target = tiny_model(12, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    prompt = [0, 1, 2, 0, 1]
    joint = exact_joint(target, prompt, 3, sampling)
    bound = tv_bound(len(joint), N_TRIALS)
    # power: emitting the layer-0 draft's tokens unchecked would be far outside the bound
    assert tv({s: p * N_TRIALS for s, p in layer_skip_joint(target, [0], prompt, 3, sampling).items()},
              joint, N_TRIALS) > 1.5 * bound
    for mode in modes:
        with monkeypatch.context() as patch:
            engine, drafter = layer_skip_engine(target, 1, mode, capacity=64, monkeypatch=patch)
            counts = sample_first3(engine, prompt, sampling)
        assert tv(counts, joint, N_TRIALS) < bound, mode


def test_sampling_shared_path_drafts_and_reuses(monkeypatch):
    target = tiny_model(12, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    engine, drafter = layer_skip_engine(target, 1, "shared-verify", capacity=64, monkeypatch=monkeypatch)
    result = engine.generate([0, 1, 2, 0, 1], GenerationConfig(12, 3, SamplingParams(1.0, seed=3)))
    s = result.stats
    assert s.drafted > 0 and drafter.tokens_fed == s.drafted + s.steps - s.k_chosen[0]


def test_tune_picks_a_candidate_and_the_choice_round_trips(deep_target, tmp_path):
    result = tune_layer_skip(deep_target, [PROMPTS[0], PROMPTS[1]], candidates=[1, [0, 1, 2], [0, 2]],
                             max_new_tokens=12, k=3)
    assert result["best"] in (1, 3, [0, 2]) and [r["layers"] for r in result["results"]] == [1, 3, [0, 2]]
    assert isinstance(result["beats_plain"], bool) and result["plain_tokens_per_second"] > 0
    for r in result["results"]:
        assert 0.0 <= r["alpha"] <= 1.0 and 1.0 <= r["tau"] <= 4.0 and r["tokens_per_second"] > 0
        assert r["new_tokens"] == 24 and r["matches_plain"] is True
    best = max(result["results"], key=lambda r: (r["tokens_per_second"], r["tau"]))
    assert result["best"] == best["layers"]
    path = tmp_path / "choices" / "layer_skip.json"
    save_choice(path, "tiny-a", result)
    save_choice(path, "tiny-b", {"best": [0, 2], "results": []})
    assert load_choice(path, "tiny-a") == result["best"] and load_choice(path, "tiny-b") == [0, 2]
    assert json.loads(path.read_text())["tiny-a"]["results"][0]["layers"] == 1
    LayerSkipDrafter(deep_target, load_choice(path, "tiny-a"), 64)  # a saved choice is usable as is
    with pytest.raises(SpecdecError, match="tune-layer-skip"):
        load_choice(path, "tiny-c")
    with pytest.raises(SpecdecError, match="tune-layer-skip"):
        load_choice(tmp_path / "missing.json", "tiny-a")
    (tmp_path / "bad.json").write_text("[1, 2")
    with pytest.raises(SpecdecError, match="cannot read"):
        load_choice(tmp_path / "bad.json", "tiny-a")


def test_default_candidates():
    assert default_candidates(2) == [1]
    assert default_candidates(4) == [1, 2, 3]
    c = default_candidates(28)
    assert 4 <= len(c) <= 8 and c[0] >= 1 and c[-1] == 27 and c == sorted(set(c))


@pytest.mark.real
def test_smollm2_layer_skip_greedy_equivalence(smollm2, monkeypatch):
    from specdec.model.tokenizer import encode_prompt
    ids = encode_prompt(smollm2.tokenizer, "Write a Python function that returns the factorial of n.", chat=True)
    plain = Engine.single(smollm2.module, NoDrafter(), 512).generate(ids, GenerationConfig(24, 1),
                                                                             smollm2.eos_ids).tokens
    n = smollm2.module.config.num_layers
    for layers, mode in ((n - 4, "shared-verify"), (list(range(0, n, 2)), "own")):
        with monkeypatch.context() as patch:
            engine, _ = layer_skip_engine(smollm2.module, layers, mode, capacity=512, monkeypatch=patch)
            result = engine.generate(ids, GenerationConfig(24, 4), smollm2.eos_ids)
        assert result.tokens == plain, (layers, mode)
