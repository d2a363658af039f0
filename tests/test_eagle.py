"""The EAGLE drafter: greedy output is plain decoding's, sampled output follows the target's exact
distribution, and the features it drafts from are the target's own, handed over by prefill and verify."""

import json

import pytest
import torch

from specdec.config import GenerationConfig, SamplingParams
from specdec.drafters.base import NoDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from specdec.heads.modules import build_head, eagle_config, medusa_config
from specdec.heads.prepared import quantize_q8_0
from tests.conftest import TINY_VOCAB, pools_draft_alike, run_engine, seat_in_pool, tiny_model
from tests.test_engine import N_TRIALS, PROMPTS, SMALL_VOCAB, exact_joint, tv, tv_bound


def eagle_head(target, draft_ids=None, seed=0):
    """A random EAGLE head for `target` over the draft vocabulary draft_ids (default: all ids)."""
    torch.manual_seed(seed)
    cfg_t = target.config
    ids = torch.arange(cfg_t.vocab_size) if draft_ids is None else torch.tensor(sorted(draft_ids))
    head = build_head(eagle_config(cfg_t, len(ids), max_positions=256))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.2)
    head.d2t.copy_(ids - torch.arange(len(ids)))
    return head.eval()


def full_features(target, tokens):
    _, h = target(torch.tensor([tokens], device=target.device), target.new_cache(256), 0, hidden=True)
    return h[0]


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("vocab", ["full", "cut"])
@pytest.mark.parametrize("lookup", [False, True])
def test_greedy_equals_plain_and_features_are_the_targets(tiny_target, k, vocab, lookup):
    """lookup: the head with prompt lookup (`--head H --ngram`), which hands the target's features on
    to the head on lookup steps too, so its later drafts start from the true ones."""
    from specdec.drafters.hybrid import HybridDrafter
    ids = None if vocab == "full" else list(range(0, TINY_VOCAB, 2))  # the head cannot draft odd ids
    head = EagleDrafter(tiny_target, eagle_head(tiny_target, ids), 256)
    drafter = HybridDrafter(head, copy_n=1) if lookup else head
    plain = Engine.single(tiny_target, NoDrafter(), 256)
    engine = Engine.single(tiny_target, drafter, 256)
    for prompt in PROMPTS:
        want = plain.generate(prompt, GenerationConfig(30, k)).tokens
        got = engine.generate(prompt, GenerationConfig(30, k))
        assert got.tokens == want
        assert got.stats.drafted > 0
        text = prompt + got.tokens
        # every committed token but the last has its feature, as a full forward computes it
        torch.testing.assert_close(head.features[:len(text) - 1], full_features(tiny_target, text)[:-1],
                                   rtol=1e-4, atol=1e-4)
    if lookup:
        assert drafter.lookup_steps > 0 and drafter.model_steps > 0 and drafter.caps.features


def test_a_proposal_is_cut_back_to_the_true_entries(tiny_target):
    """Entries built on the head's own predicted features are dropped before the next proposal:
    proposing twice from the same committed text gives the same chain."""
    head = eagle_head(tiny_target)
    drafter = EagleDrafter(tiny_target, head, 256)
    prompt = PROMPTS[2]
    drafter.start(prompt)
    h = full_features(tiny_target, prompt)
    drafter.feed(0, h)
    from specdec.drafters.base import DraftState
    draft = drafter.propose(DraftState(prompt + [3], 3, SamplingParams(), None))
    assert len(draft) == 3 and draft.is_chain
    # the head's entries were built from the fed features: re-proposing gives the same chain
    again = drafter.propose(DraftState(prompt + [3], 3, SamplingParams(), None))
    assert again.tokens.tolist() == draft.tokens.tolist()


def test_sampling_matches_target_distribution():
    sampling = SamplingParams(1.0)
    target = tiny_model(10, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    prompt = [0, 1, 2, 0, 1]
    joint = exact_joint(target, prompt, 3, sampling)
    for ids in (None, [0, 2]):  # a cut vocabulary: q(1) = 0
        engine = Engine.single(target, EagleDrafter(target, eagle_head(target, ids, seed=3), 64), 64)
        counts = {}
        for seed in range(N_TRIALS):
            cfg = GenerationConfig(4, 2, SamplingParams(1.0, seed=seed))
            seq = tuple(engine.generate(prompt, cfg).tokens[:3])
            counts[seq] = counts.get(seq, 0) + 1
        assert tv(counts, joint, N_TRIALS) < tv_bound(len(joint), N_TRIALS), ids


@pytest.mark.parametrize("lookup,on_device", [(False, False), (True, False), (False, True)],
                         ids=["head", "lookup", "on-device"])
def test_the_server_pool_gives_the_engines_tokens(tiny_target, lookup, on_device):
    """Batched verify over ragged rows hands each row its own features (lookup: the head with prompt
    lookup, its head chains drafted by the pool; on-device: the pool's chains drafted on the device);
    every row's tokens are plain decoding's."""
    from specdec.drafters.hybrid import HybridDrafter
    head = eagle_head(tiny_target)
    factory = lambda: (HybridDrafter(EagleDrafter(tiny_target, head, 256), copy_n=1) if lookup  # noqa: E731
                       else EagleDrafter(tiny_target, head, 256, on_device=on_device))
    cfg = GenerationConfig(24, 3)
    prompts = PROMPTS + [[7, 8], [9, 9, 9, 9, 9, 9]]
    expected = [Engine.single(tiny_target, NoDrafter(), 256).generate(p, cfg).tokens for p in prompts]
    stepper = Engine(tiny_target, factory, 256, max_batch=3, prefill_chunk=4)
    got = run_engine(stepper, prompts, cfg, set())
    assert [got[i] for i in range(len(prompts))] == expected


def test_a_heads_pooled_rows_are_priced_by_their_own_timing(tiny_target, tmp_path, monkeypatch):
    """A server's heads draft their rows together: the policy's d(n) comes from the head's own ragged entries
    (it has no draft model to time), at the pool's sizes; one slot keeps d(n) = n."""
    import types
    from specdec.engine.build import build_policy, pool_sizes
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    drafter = EagleDrafter(tiny_target, eagle_head(tiny_target), 256)
    drafter.start([1, 2, 3])
    before = drafter.cache.k.clone()
    curve = drafter.row_costs([2, 4], context=16, repeats=2)
    assert sorted(curve) == [1, 2, 4] and curve[1] == 1.0 and 0 < curve[2] <= curve[4]
    assert torch.equal(drafter.cache.k, before)  # timed in caches of its own
    assert pool_sizes(4) == [2, 4] and pool_sizes(12) == [2, 4, 8, 12]
    target = types.SimpleNamespace(module=tiny_target)
    pooled = build_policy(drafter, target, 3, max_batch=4)
    assert sorted(pooled.costs.draft_rows) == [1, 2, 4]
    assert build_policy(drafter, target, 3).costs.draft_rows == {1: 1.0}


def head_pool(target, prepared, n: int, on_device: bool):
    """n head drafters whose caches are rows of one batched cache, as a server's slots hold them."""
    return seat_in_pool([EagleDrafter(target, prepared, 256, on_device=on_device) for _ in range(n)])


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_a_pools_rows_drafted_together_on_the_device_equal_the_host_loop(tiny_target, sampling):
    """The pool's head chains drafted on the device (the ragged feed, then every row's chain in one graph
    under CUDA graphs): each row's tokens and q are the host loop's, at its own limit and confidence rule,
    whichever rows draft in a step."""
    from specdec.drafters.base import END, GO_ON, LAST, DraftState
    prepared = EagleDrafter(tiny_target, eagle_head(tiny_target), 256).prepared
    (host, host_cache), (device, device_cache) = (head_pool(tiny_target, prepared, 3, on) for on in (False, True))
    texts = [list(p) for p in (PROMPTS[0], PROMPTS[1], PROMPTS[2])]
    g = torch.Generator().manual_seed(7)
    rules = [None, lambda i, p: LAST if i == 2 else GO_ON, lambda i, p: GO_ON if p > 0.3 else END]
    for step in range(8):
        rows = [b for b in range(3) if (step + b) % 4]  # a row sits out now and then
        out = []
        for drafters, cache in ((host, host_cache), (device, device_cache)):
            for b in rows:
                drafters[b].feed(0, full_features(tiny_target, texts[b])[:-1])
            states = [DraftState(list(texts[b]), 1 + (step + b) % 4, sampling,
                                 None if sampling.greedy else torch.Generator().manual_seed(10 * step + b),
                                 stop=rules[b] if sampling.greedy else None, k_stop=5) for b in rows]
            out.append(drafters[0].propose_pooled([drafters[b] for b in rows], states, cache, rows))
        for row, x, y in zip(rows, *out):
            assert x.tokens.tolist() == y.tokens.tolist(), (step, row)
            if not sampling.greedy and len(x):
                torch.testing.assert_close(x.q, y.q)
            keep = int(torch.randint(0, len(x) + 1, (1,), generator=g))
            texts[row] += x.tokens.tolist()[:keep] + [int(torch.randint(0, TINY_VOCAB, (1,), generator=g))]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_server_round_drafts_every_rows_chain_in_one_head_forward_per_position(tiny_target, monkeypatch,
                                                                                 temperature):
    """The pool's rows draft together: k head forwards of all 3 rows a round (the first ragged, each
    row catching up on its own entries), none alone; greedy output stays the engine's, seeded
    sampling repeats."""
    import specdec.drafters.eagle as eagle
    head = eagle_head(tiny_target)
    factory = lambda: EagleDrafter(tiny_target, head, 256)  # noqa: E731
    k = 3
    cfg = GenerationConfig(20, k, SamplingParams(temperature=temperature, seed=5))
    prompts = [[5, 17, 3, 88, 41], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 50))]
    original, alone = eagle._ragged_entries, EagleDrafter._run

    def run(count_rounds: int = 0):
        stepper = Engine(tiny_target, factory, 256, max_batch=3, prefill_chunk=64)
        assert stepper.pool.draft_cache is not None and all(d.cache.k.data_ptr() != stepper.pool.drafters[0].cache.k.data_ptr()
                                                       for d in stepper.pool.drafters[1:])
        seqs = [stepper.add_request(p, cfg, set()) for p in prompts]
        stepper.step()  # the prefills
        calls = []
        monkeypatch.setattr(eagle, "_ragged_entries", lambda *a: calls.append(len(a[2])) or original(*a))
        monkeypatch.setattr(EagleDrafter, "_run", lambda *a, **kw: calls.append("alone") or alone(*a, **kw))
        for _ in range(count_rounds):
            stepper.step()
        monkeypatch.undo()
        while stepper.has_work:
            for seq in stepper.step():
                stepper.abort(seq)
        return [s.new_tokens for s in seqs], calls

    tokens, calls = run(count_rounds=1)
    assert calls == [3] * k  # one forward per draft position, 3 rows each
    assert tokens == run()[0]
    if temperature == 0:
        assert tokens == [Engine.single(tiny_target, factory(), 256).generate(p, cfg).tokens for p in prompts]


def test_quantize_q8_0_round_trips_within_half_a_step():
    from specdec.model import cpu_kernels
    w = torch.randn(8, 64)
    blocks = quantize_q8_0(w)
    assert blocks.shape == (8, 64 // 32 * 34) and blocks.dtype == torch.uint8
    if not cpu_kernels.available():
        pytest.skip("no CPU kernels")
    back = cpu_kernels.quant_dequantize(8, blocks, 64)
    step = w.reshape(-1, 32).abs().amax(1, keepdim=True) / 127
    assert ((back - w).reshape(-1, 32).abs() <= step * 0.51 + 1e-6).all()


def test_a_head_of_another_kind_or_model_is_refused(tiny_target):
    medusa = build_head(medusa_config(tiny_target.config, TINY_VOCAB))
    with pytest.raises(SpecdecError, match="eagle"):
        EagleDrafter(tiny_target, medusa, 64)
    other = tiny_model(2, hidden_size=32)
    with pytest.raises(SpecdecError, match="hidden size"):
        EagleDrafter(tiny_target, eagle_head(other), 64)


def test_real_model_on_its_quantized_blocks(smollm2):
    """SmolLM2-135M on the CPU backend: the head's layers on Q8_0 blocks, its LM head the target's
    own blocks for a cut vocabulary; greedy output is plain decoding's, alone and in the server pool."""
    from specdec.heads.prepared import PreparedHead
    from specdec.model.tokenizer import encode_prompt
    target = smollm2.module
    if target.weight_format != "gguf-q8":
        pytest.skip("the CPU kernels are not built here")
    prepared = PreparedHead(target, eagle_head(target, list(range(4096)) + list(smollm2.eos_ids)))
    assert type(prepared.fc).__name__ == "QuantLinear" and type(prepared.lm).__name__ == "QuantLinear"
    cfg = GenerationConfig(24, 3)
    prompts = [encode_prompt(smollm2.tokenizer, text, True) for text in ("def fib(n):", "Name three colors.")]
    plain = [Engine.single(target, NoDrafter(), 512).generate(p, cfg, smollm2.eos_ids).tokens for p in prompts]
    engine = Engine.single(target, EagleDrafter(target, prepared, 512), 512)
    assert [engine.generate(p, cfg, smollm2.eos_ids).tokens for p in prompts] == plain
    stepper = Engine(target, lambda: EagleDrafter(target, prepared, 512), 512, max_batch=2, prefill_chunk=8)
    got = run_engine(stepper, prompts, cfg, smollm2.eos_ids)
    assert [got[0], got[1]] == plain


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_generate_cli_drafts_with_a_saved_head(tiny_llama_dir, tmp_path, capsys, kind):
    """`specdec generate --head DIR`: a head saved by the training tool drafts; bad heads are clear errors."""
    import json
    from specdec.cli import main
    from specdec.heads.checkpoint import save_head, target_fingerprint
    from specdec.model import load_model
    loaded = load_model(str(tiny_llama_dir), device="cpu")
    made = eagle_head(loaded.module) if kind == "eagle" else medusa_head(loaded.module)
    save_head(made, tmp_path / "head", target_fingerprint(loaded.module, loaded.tokenizer))
    argv = ["generate", "--model", str(tiny_llama_dir), "--max-new-tokens", "12", "--json", "--policy", "fixed",
            "hello there"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(argv[:1] + ["--head", str(tmp_path / "head")] + argv[1:]) == 0
    drafted = json.loads(capsys.readouterr().out)
    assert drafted["text"] == plain["text"] and drafted["stats"]["drafted"] > 0
    assert main(argv[:1] + ["--head", str(tmp_path / "head"), "--ngram"] + argv[1:]) == 0
    hybrid = json.loads(capsys.readouterr().out)  # the head and prompt lookup
    assert hybrid["text"] == plain["text"] and "prompt lookup" in hybrid["method"]
    assert main(argv[:1] + ["--head", str(tmp_path / "missing")] + argv[1:]) != 0
    assert "no head" in capsys.readouterr().err


def test_a_head_stored_in_bf16_and_shipped_in_the_checkout_is_found_by_auto(tiny_llama_dir, tmp_path, monkeypatch):
    """--head auto: $SPECDEC_HOME's head first, else the checkout's heads/MODEL-eagle (stored in bf16,
    read back into float32)."""
    import specdec.heads.find as find
    from specdec.heads.checkpoint import load_head, save_head, target_fingerprint
    from specdec.model import load_model
    loaded = load_model(str(tiny_llama_dir), device="cpu")
    made = eagle_head(loaded.module)
    fingerprint = target_fingerprint(loaded.module, loaded.tokenizer)
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(find, "SHIPPED_HEADS", tmp_path / "checkout-heads")
    with pytest.raises(SpecdecError, match="no head 'auto'"):
        find.load_head_for("auto", loaded, str(tiny_llama_dir))
    shipped = save_head(made, tmp_path / "checkout-heads" / f"{tiny_llama_dir.name}-eagle", fingerprint,
                        dtype=torch.bfloat16)
    assert load_head(shipped)[0].fc.weight.dtype == torch.float32
    for key, value in load_head(shipped)[0].state_dict().items():
        want = made.state_dict()[key]
        assert torch.equal(value, want.to(torch.bfloat16).to(want.dtype) if want.is_floating_point() else want)
    found = find.load_head_for("auto", loaded, str(tiny_llama_dir)).head
    assert torch.equal(found.fc.weight, made.fc.weight.to(torch.bfloat16).float())
    own = eagle_head(loaded.module, seed=7)  # one trained here wins over the checkout's
    save_head(own, tmp_path / "home" / "heads" / f"{tiny_llama_dir.name}-eagle", fingerprint)
    assert torch.equal(find.load_head_for("auto", loaded, str(tiny_llama_dir)).head.fc.weight, own.fc.weight)


def test_the_confidence_rule_ends_chains_and_output_stays_exact(tiny_target):
    """The head follows DraftState.stop (END: not drafted, LAST: drafted and the chain ends, each
    asked with the draft's top probability); under the adaptive policy greedy output is plain's."""
    from specdec.drafters.base import END, GO_ON, LAST, DraftState
    from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig
    drafter = EagleDrafter(tiny_target, eagle_head(tiny_target), 256)
    prompt = PROMPTS[2]
    drafter.start(prompt)
    drafter.feed(0, full_features(tiny_target, prompt))
    tokens, asked = prompt + [3], []

    def rule(answer_at):
        def stop(i, p):
            asked.append((i, p))
            return answer_at.get(i, GO_ON)
        return stop

    for answers, length in (({0: END}, 0), ({1: LAST}, 2), ({2: END}, 2), ({}, 5)):
        asked.clear()
        tree = drafter.propose(DraftState(tokens, 2, SamplingParams(), None, stop=rule(answers), k_stop=5))
        assert len(tree) == length, answers
        assert [i for i, _ in asked] == list(range(len(asked))) and all(0 < p <= 1 for _, p in asked)
    policy = AdaptivePolicy(CostModel({1: 1.0, 2: 1.3, 3: 1.6, 9: 4.0}, 0.07), PolicyConfig(k_max=4, prior=0.9))
    engine = Engine.single(tiny_target, EagleDrafter(tiny_target, eagle_head(tiny_target), 256), 256, policy)
    plain = Engine.single(tiny_target, NoDrafter(), 256)
    for prompt in PROMPTS:
        cfg = GenerationConfig(40, 4)
        assert engine.generate(prompt, cfg).tokens == plain.generate(prompt, cfg).tokens


@pytest.mark.parametrize("budget, depth, topk", [(8, 3, 2), (16, 4, 4), (3, 2, 3)])
def test_eagle2_trees_are_exact(tiny_target, budget, depth, topk):
    """Dynamic trees (top-k expansion on the head's own features, re-ranked to the budget): greedy
    output is plain decoding's, and the kept path's features are the target's."""
    from specdec.config import TreeConfig
    drafter = EagleDrafter(tiny_target, eagle_head(tiny_target), 256, TreeConfig(budget, depth, topk))
    assert drafter.caps.tree_nodes == budget
    plain = Engine.single(tiny_target, NoDrafter(), 256)
    engine = Engine.single(tiny_target, drafter, 256)
    for prompt in PROMPTS:
        cfg = GenerationConfig(30, depth)
        got = engine.generate(prompt, cfg)
        assert got.tokens == plain.generate(prompt, cfg).tokens
        assert got.stats.verified_nodes > got.stats.steps  # trees of more than one node were verified
        text = prompt + got.tokens
        torch.testing.assert_close(drafter.features[:len(text) - 1], full_features(tiny_target, text)[:-1],
                                   rtol=1e-4, atol=1e-4)


def test_eagle2_tree_sampling_matches_target_distribution():
    from specdec.config import TreeConfig
    target = tiny_model(10, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    prompt = [0, 1, 2, 0, 1]
    joint = exact_joint(target, prompt, 3, SamplingParams(1.0))
    engine = Engine.single(target, EagleDrafter(target, eagle_head(target, seed=4), 64, TreeConfig(4, 2, 2)), 64)
    counts = {}
    for seed in range(N_TRIALS):
        seq = tuple(engine.generate(prompt, GenerationConfig(4, 2, SamplingParams(1.0, seed=seed))).tokens[:3])
        counts[seq] = counts.get(seq, 0) + 1
    assert tv(counts, joint, N_TRIALS) < tv_bound(len(joint), N_TRIALS)


def medusa_head(target, heads=3, seed=0):
    torch.manual_seed(seed)
    head = build_head(medusa_config(target.config, target.config.vocab_size, heads))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.2)
    return head.eval()


@pytest.mark.parametrize("choices", [None, ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))])
def test_medusa_chains_and_static_trees_are_exact(tiny_target, choices):
    from specdec.drafters.eagle import MedusaDrafter
    drafter = MedusaDrafter(tiny_target, medusa_head(tiny_target), 256, choices)
    plain = Engine.single(tiny_target, NoDrafter(), 256)
    engine = Engine.single(tiny_target, drafter, 256)
    for prompt in PROMPTS:
        cfg = GenerationConfig(30, 3)
        got = engine.generate(prompt, cfg)
        assert got.tokens == plain.generate(prompt, cfg).tokens
        assert got.stats.verified_nodes > 2 * got.stats.steps  # chains of 3, trees of 6, less near the budget
    with pytest.raises(SpecdecError, match="deep"):
        MedusaDrafter(tiny_target, medusa_head(tiny_target, heads=1), 64, ((0,), (0, 0)))


def test_medusa_sampling_matches_target_distribution():
    from specdec.drafters.eagle import MedusaDrafter
    target = tiny_model(10, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    prompt = [0, 1, 2, 0, 1]
    joint = exact_joint(target, prompt, 3, SamplingParams(1.0))
    engine = Engine.single(target, MedusaDrafter(target, medusa_head(target, 2, seed=5), 64), 64)
    counts = {}
    for seed in range(N_TRIALS):
        seq = tuple(engine.generate(prompt, GenerationConfig(4, 2, SamplingParams(1.0, seed=seed))).tokens[:3])
        counts[seq] = counts.get(seq, 0) + 1
    assert tv(counts, joint, N_TRIALS) < tv_bound(len(joint), N_TRIALS)


def test_head_flags_that_do_not_fit_are_clear_errors(tiny_llama_dir, tmp_path, capsys):
    """A static tree for an EAGLE head, a dynamic one for Medusa, --head with a drafter other than --ngram, and a
    head made for another model: each a one-line error."""
    from specdec.cli import main
    from specdec.heads.checkpoint import save_head, target_fingerprint
    from specdec.model import load_model
    loaded = load_model(str(tiny_llama_dir), device="cpu")
    made_for = target_fingerprint(loaded.module, loaded.tokenizer)
    save_head(eagle_head(loaded.module), tmp_path / "eagle", made_for)
    save_head(medusa_head(loaded.module), tmp_path / "medusa", made_for)
    other = tiny_model(2, hidden_size=32)
    save_head(eagle_head(other), tmp_path / "other", {"hidden_size": 32, "vocab_size": TINY_VOCAB})
    base = ["generate", "--model", str(tiny_llama_dir), "--max-new-tokens", "4", "--json"]
    cases = [(["--head", str(tmp_path / "eagle"), "--tree-choices", "[[0],[1]]"], "static --tree-choices"),
             (["--head", str(tmp_path / "medusa"), "--tree-budget", "8"], "not --tree-budget"),
             (["--head", str(tmp_path / "eagle"), "--suffix"], "choose one drafting method"),
             (["--head", str(tmp_path / "eagle"), "--ngram", "--tree-budget", "8"], "need a draft model"),
             (["--head", str(tmp_path / "missing"), "--ngram"], "no head"),
             (["--head", str(tmp_path / "other")], "hidden")]
    for flags, message in cases:
        assert main(base + flags + ["hi"]) == 2, flags
        assert message in capsys.readouterr().err, flags


def test_profile_times_a_head_and_the_adaptive_policy_prices_both_kinds(tiny_llama_dir, tmp_path, capsys):
    """`specdec profile --head` reports the head's c; generate with either kind of head under the
    default adaptive policy (which times the head for its c) answers as plain decoding does."""
    from specdec.cli import main
    from specdec.heads.checkpoint import save_head, target_fingerprint
    from specdec.model import load_model
    loaded = load_model(str(tiny_llama_dir), device="cpu")
    made_for = target_fingerprint(loaded.module, loaded.tokenizer)
    save_head(eagle_head(loaded.module), tmp_path / "eagle", made_for)
    save_head(medusa_head(loaded.module), tmp_path / "medusa", made_for)
    base = ["--model", str(tiny_llama_dir), "--device", "cpu"]
    for kind in ("eagle", "medusa"):
        out = tmp_path / f"profile-{kind}.json"
        assert main(["profile", *base, "--head", str(tmp_path / kind), "--context", "16", "--repeats", "1",
                     "--out", str(out)]) == 0
        result = json.loads(out.read_text())
        assert result["head_cost_ratio"] > 0 and result["head_step_seconds"] > 0
        assert "c = " in capsys.readouterr().out
    texts = {}
    for flags in ([], ["--head", str(tmp_path / "eagle")], ["--head", str(tmp_path / "medusa")]):
        assert main(["generate", *base, "--max-new-tokens", "12", "--json", *flags, "w1 w2 w3"]) == 0
        texts[tuple(flags)] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"]
    assert len(set(texts.values())) == 1


def test_profile_with_a_head_that_is_not_there_is_a_clear_error(tiny_llama_dir, tmp_path, capsys):
    from specdec.cli import main
    assert main(["profile", "--model", str(tiny_llama_dir), "--device", "cpu", "--head", str(tmp_path / "none"),
                 "--out", str(tmp_path / "p.json")]) == 2
    assert "no head" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_bench_runs_the_heads_chain_and_tree_exactly(tiny_llama_dir, tmp_path, capsys):
    """`specdec bench --methods plain,eagle:2,eagle-tree:6,eagle-hybrid:2 --head DIR`: the head's chain, its dynamic
    tree of 6 nodes and its chain with prompt lookup, every output plain decoding's."""
    from specdec.cli import main
    from specdec.heads.checkpoint import save_head, target_fingerprint
    from specdec.model import load_model
    loaded = load_model(str(tiny_llama_dir), device="cpu")
    save_head(eagle_head(loaded.module), tmp_path / "eagle", target_fingerprint(loaded.module, loaded.tokenizer))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 1} w{i + 2}", "id": str(i)}) + "\n" for i in range(2)))
    out = tmp_path / "run"
    assert main(["bench", "--model", str(tiny_llama_dir), "--device", "cpu", "--methods",
                 "plain,eagle:2,eagle-tree:6,eagle-hybrid:2", "--head", str(tmp_path / "eagle"), "--dataset", str(prompts),
                 "--max-new-tokens", "10", "--no-plots", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())["methods"]
    assert set(summary) == {"plain", "eagle:2", "eagle-tree:6", "eagle-hybrid:2"}
    for label in ("eagle:2", "eagle-tree:6", "eagle-hybrid:2"):
        assert summary[label]["greedy_mismatches"] == [] and summary[label]["drafted"] > 0


def test_a_head_with_prompt_lookup_samples_the_targets_distribution():
    from specdec.drafters.hybrid import HybridDrafter
    sampling = SamplingParams(1.0)
    target = tiny_model(10, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    prompt = [0, 1, 2, 0, 1, 2, 0, 1]  # lookup drafts at the start, the head where the text stops repeating
    joint = exact_joint(target, prompt, 3, sampling)
    drafter = HybridDrafter(EagleDrafter(target, eagle_head(target, [0, 2], seed=3), 64), copy_n=2)
    engine = Engine.single(target, drafter, 64)
    counts = {}
    for seed in range(N_TRIALS):
        seq = tuple(engine.generate(prompt, GenerationConfig(4, 2, SamplingParams(1.0, seed=seed))).tokens[:3])
        counts[seq] = counts.get(seq, 0) + 1
    assert tv(counts, joint, N_TRIALS) < tv_bound(len(joint), N_TRIALS)
    assert drafter.lookup_steps > 0 and drafter.model_steps > 0


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_the_heads_device_chain_equals_its_host_loop(tiny_target, sampling):
    """The chain drafted on the device (one host sync; a CUDA graph on a GPU), run eagerly here: the host
    loop's tokens, q and confidence-rule cuts, step after step as verification moves on."""
    from specdec.drafters.base import END, GO_ON, LAST, DraftState
    ids = list(range(0, TINY_VOCAB, 2))
    head = eagle_head(tiny_target, ids, seed=4)
    host, device = EagleDrafter(tiny_target, head, 256), EagleDrafter(tiny_target, head, 256, on_device=True)
    assert host.chains is None and device.chains is not None
    tokens = list(PROMPTS[0])
    rules = [None, lambda i, p: END if i == 2 else GO_ON, lambda i, p: LAST if i == 1 else GO_ON,
             lambda i, p: GO_ON if p > 0.3 else END]
    g = torch.Generator().manual_seed(7)
    for d in (host, device):
        d.start(tokens)
    drafted = 0
    for step in range(8):
        h = full_features(tiny_target, tokens)
        out = []
        for d in (host, device):
            d.feed(0, h)
            gen = None if sampling.greedy else torch.Generator().manual_seed(step)
            out.append(d.propose(DraftState(list(tokens), 1 + step % 5, sampling, gen, stop=rules[step % 4])))
        assert out[0].tokens.tolist() == out[1].tokens.tolist(), step
        drafted += len(out[0])
        if not sampling.greedy and len(out[0]):
            torch.testing.assert_close(out[0].q, out[1].q)
        keep = int(torch.randint(0, len(out[0]) + 1, (1,), generator=g))
        tokens += out[0].tokens.tolist()[:keep] + [int(torch.randint(0, TINY_VOCAB, (1,), generator=g))]
    assert drafted >= 8


def test_greedy_with_the_heads_device_chain_equals_plain(tiny_target):
    drafter = EagleDrafter(tiny_target, eagle_head(tiny_target, seed=5), 256, on_device=True)
    plain, engine = Engine.single(tiny_target, NoDrafter(), 256), Engine.single(tiny_target, drafter, 256)
    for prompt in PROMPTS:
        want = plain.generate(prompt, GenerationConfig(30, 4)).tokens
        got = engine.generate(prompt, GenerationConfig(30, 4))
        assert got.tokens == want and got.stats.drafted > 0


@pytest.mark.parametrize("shape", [(16, 4, 4), (9, 3, 2)], ids=["budget16-depth4-topk4", "budget9-depth3-topk2"])
def test_the_heads_device_tree_is_the_host_loops_tree(tiny_target, shape):
    """EAGLE-2's levels on the device (one host read a tree; one CUDA graph on a GPU), run eagerly here: the
    host loop's tree, node for node, step after step, at depths the policy cuts too."""
    from specdec.config import TreeConfig
    from specdec.drafters.base import DraftState
    head = eagle_head(tiny_target, list(range(0, TINY_VOCAB, 2)), seed=8)
    tree = TreeConfig(*shape)
    host = EagleDrafter(tiny_target, head, 256, tree=tree)
    device = EagleDrafter(tiny_target, head, 256, tree=tree, on_device=True)
    tokens, g = list(PROMPTS[1]), torch.Generator().manual_seed(9)
    for d in (host, device):
        d.start(tokens)
    for step in range(6):
        h = full_features(tiny_target, tokens)
        out = []
        for d in (host, device):
            d.feed(0, h)
            out.append(d.propose(DraftState(list(tokens), tree.depth - step % 2, SamplingParams(), None)))
        assert out[0].tokens.tolist() == out[1].tokens.tolist(), step
        assert out[0].parents.tolist() == out[1].parents.tolist(), step
        assert 0 < len(out[0]) <= tree.budget and host.cache.length == device.cache.length
        tokens += out[0].tokens.tolist()[:1] + [int(torch.randint(0, TINY_VOCAB, (1,), generator=g))]


def test_greedy_with_the_heads_device_tree_equals_plain(tiny_target):
    from specdec.config import TreeConfig
    drafter = EagleDrafter(tiny_target, eagle_head(tiny_target, seed=5), 256, tree=TreeConfig(12, 3, 3), on_device=True)
    plain, engine = Engine.single(tiny_target, NoDrafter(), 256), Engine.single(tiny_target, drafter, 256)
    for prompt in PROMPTS:
        want = plain.generate(prompt, GenerationConfig(30, 3)).tokens
        got = engine.generate(prompt, GenerationConfig(30, 3))
        assert got.tokens == want and got.stats.drafted > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", ["chain-greedy", "chain-sampled", "tree"])
def test_the_heads_graphed_drafts_equal_its_eager_ones_on_cuda(case):
    from specdec.config import TreeConfig
    from specdec.drafters.base import DraftState
    from specdec.model.cuda_graphs import enable_cuda_graphs
    sampling = SamplingParams(temperature=0.8, top_k=20, top_p=0.9) if case == "chain-sampled" else SamplingParams()
    tree = TreeConfig(12, 3, 3) if case == "tree" else None
    eager_target, graph_target = tiny_model(0).cuda(), tiny_model(0).cuda()
    enable_cuda_graphs(graph_target)
    head = eagle_head(eager_target, seed=6)
    eager = EagleDrafter(eager_target, head, 256, tree=tree, on_device=True)
    graphed = EagleDrafter(graph_target, head, 256, tree=tree)
    tokens = list(PROMPTS[0])
    for step in range(6):
        h = full_features(eager_target, tokens)
        out = []
        for d in (eager, graphed):
            d.feed(0, h)
            gen = None if sampling.greedy else torch.Generator("cuda").manual_seed(step)
            out.append(d.propose(DraftState(list(tokens), 3, sampling, gen)))
        assert out[0].tokens.tolist() == out[1].tokens.tolist()
        assert out[0].parents.tolist() == out[1].parents.tolist()
        tokens += out[0].tokens.tolist()[:step % 3] + [3]
    assert graphed.chains.captures >= 1 and graphed.chains.graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_a_pools_graphed_head_chains_equal_its_eager_ones_on_cuda(sampling):
    from specdec.model.cuda_graphs import enable_cuda_graphs
    eager_target, graph_target = tiny_model(0).cuda(), tiny_model(0).cuda()
    enable_cuda_graphs(graph_target)
    head = eagle_head(eager_target, seed=6)
    pools = [head_pool(t, EagleDrafter(t, head, 256).prepared, 2, True) for t in (eager_target, graph_target)]
    texts = [list(PROMPTS[0]), list(PROMPTS[1])]

    def features(drafters, texts):
        for d, text in zip(drafters, texts):
            d.feed(0, full_features(eager_target, text)[:-1])
    pools_draft_alike(pools, texts, sampling, before=features)
