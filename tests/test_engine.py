"""The engine loop on tiny random fp32 models: greedy equivalence and the sampled distribution."""

import itertools
import math

import pytest
import torch

from specdec.config import GenerationConfig, SamplingParams
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig
from tests.conftest import TINY_VOCAB, tiny_model

PROMPTS = [[5, 17, 3, 88, 41], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 60))]


def run(target, drafter, prompt, k=4, max_new=40, sampling=SamplingParams(), eos=frozenset()):
    engine = Engine.single(target, drafter, capacity=256)
    return engine.generate(prompt, GenerationConfig(max_new, k, sampling), eos)


@pytest.fixture(scope="module")
def plain_outputs(tiny_target):
    return [run(tiny_target, NoDrafter(), p).tokens for p in PROMPTS]


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("which", ["self", "other", "ngram", "self-truncated-head", "hybrid", "other-window",
                                   "hybrid-window"])
def test_greedy_equivalence_tiny(tiny_target, tiny_draft, plain_outputs, which, k):
    drafter = {"self": lambda: DraftModelDrafter(tiny_target, TINY_VOCAB, 256),
               "other": lambda: DraftModelDrafter(tiny_draft, TINY_VOCAB, 256),
               # the draft sees only the prompt's last 3 tokens (prompts of 5, 8 and 30)
               "other-window": lambda: DraftModelDrafter(tiny_draft, TINY_VOCAB, 256, window=3),
               "hybrid-window": lambda: HybridDrafter(DraftModelDrafter(tiny_draft, TINY_VOCAB, 256, window=3), copy_n=2),
               "self-truncated-head": lambda: DraftModelDrafter(tiny_target, TINY_VOCAB, 256, head_rows=48),
               "ngram": lambda: NgramDrafter(3, 1),
               "hybrid": lambda: HybridDrafter(DraftModelDrafter(tiny_draft, TINY_VOCAB, 256), copy_n=2)}[which]()
    for prompt, expected in zip(PROMPTS, plain_outputs):
        result = run(tiny_target, drafter, prompt, k=k)
        assert result.tokens == expected, f"{which} k={k} diverged on prompt {prompt}"
        if which == "self":  # the target drafting for itself: every draft token is accepted
            assert result.stats.alpha == 1.0 and result.stats.tau == pytest.approx(k + 1, abs=1.0)


def test_truncated_head_drafts_only_low_ids_and_leaves_the_model_alone(tiny_target):
    drafter = DraftModelDrafter(tiny_target, TINY_VOCAB, 256, head_rows=10)
    assert drafter.model.lm_head.weight.shape[0] == 10 and tiny_target.lm_head.weight.shape[0] == TINY_VOCAB
    assert drafter.model.lm_head.weight.data_ptr() == tiny_target.lm_head.weight.data_ptr()  # a view
    from specdec.drafters.base import DraftState
    drafter.start(PROMPTS[0])
    tree = drafter.propose(DraftState(PROMPTS[0], 5, SamplingParams(), None))
    assert len(tree) == 5 and all(t < 10 for t in tree.tokens.tolist())


def test_random_drafter_is_mostly_rejected_but_exact(tiny_target, tiny_draft, plain_outputs):
    result = run(tiny_target, DraftModelDrafter(tiny_draft, TINY_VOCAB, 256), PROMPTS[0], k=4)
    assert result.tokens == plain_outputs[0]
    assert result.stats.alpha < 0.5
    assert result.stats.steps > 40 / 4  # few tokens per step when most drafts fail


def test_plain_decoding_stats(tiny_target):
    result = run(tiny_target, NoDrafter(), PROMPTS[0], max_new=10)
    s = result.stats
    assert (s.new_tokens, s.steps, s.drafted, s.tau) == (10, 9, 0, 1.0)
    assert result.finish_reason == "length"


def test_budget_and_eos(tiny_target, plain_outputs):
    expected = plain_outputs[0]
    eos = expected[7]
    first = expected.index(eos)
    result = run(tiny_target, DraftModelDrafter(tiny_target, TINY_VOCAB, 256), PROMPTS[0], eos={eos})
    assert result.tokens == expected[:first + 1] and result.finish_reason == "stop"
    result = run(tiny_target, DraftModelDrafter(tiny_target, TINY_VOCAB, 256), PROMPTS[0], k=8, max_new=5)
    assert result.tokens == expected[:5] and result.stats.new_tokens == 5


def test_stats_per_position(tiny_target):
    s = run(tiny_target, DraftModelDrafter(tiny_target, TINY_VOCAB, 256), PROMPTS[0], k=3, max_new=13).stats
    assert s.per_position_acceptance == [1.0, 1.0, 1.0]
    assert sum(s.emitted_per_step) == s.new_tokens - 1  # the prefill emits the first token


def test_context_overflow_is_a_clear_error(tiny_target):
    engine = Engine.single(tiny_target, NoDrafter(), capacity=16)
    with pytest.raises(SpecdecError, match="context"):
        engine.generate(list(range(10)), GenerationConfig(max_new_tokens=8))
    with pytest.raises(SpecdecError, match="empty"):
        engine.generate([], GenerationConfig(max_new_tokens=8))


def test_near_capacity_caps_k_and_stays_exact(tiny_target):
    prompt = list(range(20))
    expected = Engine.single(tiny_target, NoDrafter(), 28).generate(prompt, GenerationConfig(8, 1)).tokens
    engine = Engine.single(tiny_target, DraftModelDrafter(tiny_target, TINY_VOCAB, 28), 28)
    assert engine.generate(prompt, GenerationConfig(8, 6)).tokens == expected


# ---- sampling: the first 3 generated tokens follow the target's exact joint distribution ----

SMALL_VOCAB = 3
N_TRIALS = 2000


def exact_joint(model, prompt, n, sampling):
    """P(t1..tn | prompt) for every sequence, by enumeration with full forwards."""
    from specdec.sampling.logits import probs_from_logits
    joint = {}
    for seq in itertools.product(range(SMALL_VOCAB), repeat=n):
        x = torch.tensor([prompt + list(seq)])
        logits = model(x, model.new_cache(64), 0)[0]  # [T, vocab]
        probs = probs_from_logits(logits, sampling)
        rows = range(len(prompt) - 1, len(prompt) - 1 + n)
        joint[seq] = math.prod(probs[r, t].item() for r, t in zip(rows, seq))
    return joint


def tv(counts: dict, joint: dict, n: int) -> float:
    return 0.5 * sum(abs(counts.get(s, 0) / n - p) for s, p in joint.items())


def tv_bound(cells: int, n: int, delta: float = 1e-4) -> float:
    """E[TV] <= 0.5 * sqrt(cells / n); McDiarmid adds sqrt(ln(1/delta) / (2n)) with prob. >= 1 - delta."""
    return 0.5 * math.sqrt(cells / n) + math.sqrt(math.log(1 / delta) / (2 * n))


def sample_first3(target, drafter, prompt, sampling, policy=None):
    engine = Engine.single(target, drafter, capacity=64, policy=policy)
    counts = {}
    for seed in range(N_TRIALS):
        cfg = GenerationConfig(4, 3, SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, seed))
        seq = tuple(engine.generate(prompt, cfg).tokens[:3])
        counts[seq] = counts.get(seq, 0) + 1
    return counts


@pytest.mark.parametrize("sampling, methods", [
    (SamplingParams(1.0), ("draft", "ngram", "plain", "draft-truncated-head", "draft-p-min", "draft-adaptive",
                           "draft-confidence", "draft-window", "hybrid", "hybrid-lookup-only", "draft-deferred",
                           "draft-waiting-lookup")),
    (SamplingParams(0.7, top_k=2, top_p=0.9), ("draft",)),
])
def test_speculative_sampling_matches_target_distribution(sampling, methods):
    """Tokens 2 and 3 come from verifying a 2-token draft chain (accepted, recovered or bonus)."""
    target = tiny_model(10, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    draft = tiny_model(11, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    prompt = [0, 1, 2, 0, 1]
    joint = exact_joint(target, prompt, 3, sampling)
    bound = tv_bound(len(joint), N_TRIALS)
    # power: a sampler that emitted the draft's tokens unchecked would be far outside the bound
    assert 0.5 * sum(abs(a - b) for a, b in zip(joint.values(), exact_joint(draft, prompt, 3, sampling).values())) > 1.5 * bound
    drafters = {"draft": DraftModelDrafter(draft, SMALL_VOCAB, 64), "ngram": NgramDrafter(2, 1), "plain": NoDrafter(),
                "draft-truncated-head": DraftModelDrafter(draft, SMALL_VOCAB, 64, head_rows=2),  # q(2) = 0
                "draft-p-min": DraftModelDrafter(draft, SMALL_VOCAB, 64, p_min=0.5),  # drafts of varying length
                "draft-adaptive": DraftModelDrafter(draft, SMALL_VOCAB, 64),
                "draft-window": DraftModelDrafter(draft, SMALL_VOCAB, 64, window=2),  # sees [1, 0] + its own text
                "draft-confidence": DraftModelDrafter(draft, SMALL_VOCAB, 64),
                # steps alternate between lookup (q one-hot) and the model (q = its distribution)
                "hybrid": HybridDrafter(DraftModelDrafter(draft, SMALL_VOCAB, 64), copy_n=2),
                "hybrid-lookup-only": HybridDrafter(DraftModelDrafter(draft, SMALL_VOCAB, 64), copy_n=2),
                "draft-deferred": DraftModelDrafter(draft, SMALL_VOCAB, 64),
                # --draft MODEL: lookup while the draft waits, under the policy's waiting one
                "draft-waiting-lookup": HybridDrafter(DraftModelDrafter(draft, SMALL_VOCAB, 64), copy_n=None)}
    # k chosen per step from the acceptance seen so far (free verification: the policy drafts)
    policies = {"draft-adaptive": AdaptivePolicy(CostModel({1: 1.0, 9: 1.0}, 0.1), PolicyConfig(k_max=3, decay=0.5)),
                # verify positions dear enough that the confidence rule ends some chains early, not others
                "draft-confidence": AdaptivePolicy(CostModel({1: 1.0, 2: 1.3, 3: 1.6, 9: 4.0}, 0.4),
                                                   PolicyConfig(k_max=3, prior=0.9)),
                # a draft prefill the policy never admits: every request drafts by lookup alone
                "hybrid-lookup-only": AdaptivePolicy(CostModel({1: 1.0, 9: 1.0}, 0.1, prefill_cost=100.0),
                                                     PolicyConfig(k_max=3)),
                # never committed to at the start, started after the first token (rented one step)
                "draft-deferred": AdaptivePolicy(CostModel({1: 1.0, 9: 1.0}, 0.1, prefill_cost=1e-6),
                                                 PolicyConfig(k_max=3, prior=0.9, commit_share=0.0, memory=0.0)),
                "draft-waiting-lookup": AdaptivePolicy(CostModel({1: 1.0, 9: 1.0}, 0.1, prefill_cost=100.0),
                                                       PolicyConfig(k_max=3), AdaptivePolicy.lookup_while_waiting(
                                                           CostModel({1: 1.0, 9: 1.0}), 3))}
    for method in methods:
        counts = sample_first3(target, drafters[method], prompt, sampling, policies.get(method))
        assert tv(counts, joint, N_TRIALS) < bound, method


def test_same_seed_same_output(tiny_target, tiny_draft):
    cfg = GenerationConfig(20, 4, SamplingParams(0.8, seed=123))
    runs = [Engine.single(tiny_target, DraftModelDrafter(tiny_draft, TINY_VOCAB, 64), 64)
            .generate(PROMPTS[0], cfg).tokens for _ in range(2)]
    assert runs[0] == runs[1]


def test_a_draft_window_prefills_only_the_prompts_tail_and_feeds_every_later_token(tiny_target, tiny_draft):
    drafter = DraftModelDrafter(tiny_draft, TINY_VOCAB, 256, window=4)
    assert drafter.prefill_tokens(30) == 4 and drafter.prefill_tokens(3) == 2
    prompt = PROMPTS[2]  # 30 tokens
    drafter.start(prompt)
    assert drafter.offset == 25 and drafter.cached == prompt[25:29] and drafter.cache.length == 4
    result = run(tiny_target, drafter, prompt, k=3, max_new=12)
    # after the request: the cache holds the window, then the generated text (minus what was never fed)
    full = prompt + result.tokens
    assert drafter.cached == full[25:25 + len(drafter.cached)] and len(drafter.cached) >= 4 + len(result.tokens) - 4
    assert drafter.cache.length == len(drafter.cached)
    with pytest.raises(SpecdecError, match="window"):
        DraftModelDrafter(tiny_draft, TINY_VOCAB, 256, window=-1)


def test_a_draft_prefill_counts_only_what_its_cache_lacks(tiny_target, tiny_draft, monkeypatch):
    """A request that extends the last one's text (a conversation's next turn, an editor's next keystroke):
    the draft's cache still holds that text, so its prefill feeds only the rest, and the policy is asked
    about, and calibrated by, those tokens alone; a windowed draft holds nothing over."""
    from specdec.policy.face import FixedPolicy
    seen = []
    monkeypatch.setattr(FixedPolicy, "observe_prefill", lambda self, n, seconds: seen.append(n))
    drafter = DraftModelDrafter(tiny_draft, TINY_VOCAB, 256)
    engine = Engine.single(tiny_target, drafter, 256)
    prompt = PROMPTS[2]
    first = engine.generate(prompt, GenerationConfig(12, 3))
    turn2 = prompt + first.tokens + [5, 6, 7]
    held = drafter.held(turn2)
    assert held == len(drafter.cached) >= len(prompt) - 1 and drafter.cached == turn2[:held]
    second = engine.generate(turn2, GenerationConfig(12, 3))
    assert seen == [len(prompt) - 1, len(turn2) - 1 - held]
    assert second.tokens == Engine.single(tiny_target, DraftModelDrafter(tiny_draft, TINY_VOCAB, 256), 256).generate(
        turn2, GenerationConfig(12, 3)).tokens  # the kept cache drafts as a fresh one would
    assert drafter.held([9] + turn2[1:]) == 0  # another text from its first token: nothing held
    windowed = DraftModelDrafter(tiny_draft, TINY_VOCAB, 256, window=4)
    windowed.start(prompt)
    assert windowed.held(prompt + [5]) == 0


def test_the_first_token_is_streamed_before_the_draft_prefills_the_prompt(tiny_target, tiny_draft, plain_outputs):
    """The first token waits for the target's prefill alone: the draft model's prefill (the prompt,
    as before) comes after it is emitted; a request that ends at its first token prefills no draft."""
    events = []

    class Recording(DraftModelDrafter):
        def start(self, prompt):
            events.append(("start", list(prompt)))
            super().start(prompt)

    drafter = Recording(tiny_draft, TINY_VOCAB, 256)
    engine = Engine.single(tiny_target, drafter, capacity=256)
    result = engine.generate(PROMPTS[0], GenerationConfig(20, 4), frozenset(),
                             on_tokens=lambda new: events.append(("tokens", list(new))))
    assert result.tokens == plain_outputs[0][:20]
    assert events[0] == ("tokens", plain_outputs[0][:1]) and events[1] == ("start", PROMPTS[0])
    assert result.stats.draft_started_at == 0 and result.stats.drafted > 0
    events.clear()
    engine.generate(PROMPTS[0], GenerationConfig(1, 4), frozenset(), on_tokens=lambda new: events.append(("tokens", new)))
    assert [e[0] for e in events] == ["tokens"]
