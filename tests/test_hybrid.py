"""The hybrid drafter (draft model + prompt lookup): which source each step uses, and admission."""

import pytest

from specdec.config import GenerationConfig, SamplingParams
from specdec.drafters.base import DraftState, NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.hybrid import HybridDrafter
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig
from tests.conftest import TINY_VOCAB

FREE = CostModel({1: 1.0, 9: 1.0}, 0.1)


def state(tokens, k=4):
    return DraftState(list(tokens), k, SamplingParams(), None)


def test_copies_when_the_last_tokens_repeat_and_asks_the_model_otherwise(tiny_draft):
    hybrid = HybridDrafter(DraftModelDrafter(tiny_draft, TINY_VOCAB, 128), copy_n=3)
    text = [7, 8, 9, 10, 11, 12, 50, 7, 8, 9]
    hybrid.start(text)
    assert hybrid.propose(state(text)).tokens.tolist() == [10, 11, 12, 50]  # the trigram 7 8 9 occurred
    assert hybrid.lookup_steps == 1 and hybrid.model_steps == 0
    fresh = [1, 2, 3, 4, 5, 6]
    hybrid.start(fresh)
    tree = hybrid.propose(state(fresh))
    assert len(tree) == 4 and hybrid.model_steps == 1  # no repeat: the model drafts


def test_lookup_only_never_touches_the_model(tiny_draft):
    model = DraftModelDrafter(tiny_draft, TINY_VOCAB, 128)
    hybrid = HybridDrafter(model, copy_n=3, max_n=3, min_n=1)
    hybrid.start_lookup_only([1, 2, 3, 1])
    assert hybrid.propose(state([1, 2, 3, 1], k=2)).tokens.tolist() == [2, 3]  # a unigram match is enough now
    assert len(hybrid.propose(state([4, 5, 6]))) == 0 and hybrid.model_steps == 0 and model.cache.length == 0


def test_greedy_equivalence_with_policy_and_admission(tiny_target, tiny_draft):
    prompts = [[5, 17, 3, 88, 41], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 60))]
    cfg = GenerationConfig(40, 5, SamplingParams())
    plain = Engine.single(tiny_target, NoDrafter(), 256)
    for prefill_cost in (0.0, 100.0):  # admitted (model + lookup) and refused (lookup alone)
        policy = AdaptivePolicy(CostModel(FREE.verify_cost, 0.1, prefill_cost=prefill_cost), PolicyConfig(k_max=5))
        drafter = HybridDrafter(DraftModelDrafter(tiny_draft, TINY_VOCAB, 256), copy_n=2)
        engine = Engine.single(tiny_target, drafter, 256, policy)
        for prompt in prompts:
            result = engine.generate(prompt, cfg)
            assert result.tokens == plain.generate(prompt, cfg).tokens
        assert (drafter.model_steps == 0) == (prefill_cost > 0)
        assert drafter.lookup_steps + drafter.model_steps > 0


def test_a_started_model_without_copy_n_drafts_every_step_and_lookup_only_the_waiting_ones(tiny_draft):
    """copy_n None (`--draft MODEL` alone): once started the model drafts even where the text repeats;
    while it waits (not admitted), lookup drafts and the model is not touched."""
    model = DraftModelDrafter(tiny_draft, TINY_VOCAB, 128)
    waiting = HybridDrafter(model, copy_n=None)
    text = [7, 8, 9, 10, 11, 12, 50, 7, 8, 9]
    waiting.start_lookup_only(text)
    assert waiting.propose(state(text)).tokens.tolist() == [10, 11, 12, 50] and model.cache.length == 0
    waiting.start(text)  # the policy starts the model: every step is the model's, repeats or not
    assert waiting.propose(state(text)).tokens.tolist() == model.propose(state(text)).tokens.tolist()
    assert (waiting.lookup_steps, waiting.model_steps) == (1, 1)


def test_the_draft_method_waits_with_lookup_and_keeps_greedy_output(tiny_llama_dir, tiny_qwen_dir):
    """The registry's `draft` (what --draft MODEL builds): a chain drafter drafts by lookup while the policy
    holds the draft's prefill back and by the model once admitted, and greedy output is plain decoding's
    either way; a tree drafter and a draft of another tokenizer stay the model's own."""
    from specdec.config import TreeConfig
    from specdec.model import load_model
    from tests.conftest import make_drafter
    target, draft = load_model(str(tiny_llama_dir), device="cpu"), load_model(str(tiny_qwen_dir), device="cpu")
    prompts = [[5, 17, 3, 88, 41], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 60)) + list(range(30, 40))]
    cfg = GenerationConfig(40, 5, SamplingParams())
    plain = Engine.single(target.module, NoDrafter(), 256)
    for prefill_cost in (0.0, 100.0):  # admitted at once, and held back (lookup alone)
        drafter = make_drafter("draft", target, 256, draft)
        assert isinstance(drafter, HybridDrafter) and drafter.copy_n is None
        costs = CostModel(FREE.verify_cost, 0.1, prefill_cost=prefill_cost)
        policy = AdaptivePolicy(costs, PolicyConfig(k_max=5), AdaptivePolicy.lookup_while_waiting(costs, 5))
        engine = Engine.single(target.module, drafter, 256, policy)
        for prompt in prompts:
            assert engine.generate(prompt, cfg).tokens == plain.generate(prompt, cfg).tokens
        assert (drafter.lookup_steps > 0, drafter.model_steps > 0) == (prefill_cost > 0, prefill_cost == 0)
        stats = engine.generate(prompts[1], cfg).stats  # lookups counted as such only while the draft waits
        assert (stats.lookup_drafted > 0, stats.draft_started_at) == ((True, None) if prefill_cost else (False, 0))
    tree = make_drafter("draft", target, 256, draft, tree=TreeConfig(8, 3, 2))
    assert isinstance(tree, DraftModelDrafter) and tree.caps.tree_nodes > 0


def test_a_waiting_lookup_is_the_waiting_policys_and_the_drafters_policy_reads_the_target(tiny_target, tiny_draft):
    """While the draft model waits (its prefill priced too high to start), lookup drafts under the policy's
    waiting one: that one chooses k and learns the lookups' outcomes; the draft model's own policy counts
    no lookup outcome, but takes the target's confidence at every emitted token as a plain step's
    (its shadow) and counts every token toward the answer's length. Greedy output is plain's."""
    cfg = GenerationConfig(40, 5, SamplingParams())
    costs = CostModel(FREE.verify_cost, 0.1, prefill_cost=100.0)
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=5), AdaptivePolicy.lookup_while_waiting(costs, 5))
    drafter = HybridDrafter(DraftModelDrafter(tiny_draft, TINY_VOCAB, 256), copy_n=None)
    engine = Engine.single(tiny_target, drafter, 256, policy)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    result = engine.generate(prompt, cfg)
    assert result.tokens == Engine.single(tiny_target, NoDrafter(), 256).generate(prompt, cfg).tokens
    assert result.stats.draft_started_at is None and drafter.model_steps == 0 and drafter.lookup_steps > 0
    s = result.stats  # every draft was a waiting lookup's, and the counts say so
    assert (s.lookup_drafted, s.lookup_accepted) == (s.drafted, s.accepted) and s.drafted > 0
    emitted = len(result.tokens) - 1  # every token but the prefill's came from a waiting step
    assert policy.waiting.request.trials > 0  # the lookups' outcomes are the waiting policy's
    assert policy.request.trials == 0 and policy.pool.trials == 0
    assert policy.request_shadow.trials == emitted and policy.request_tokens == emitted
    assert policy.waiting.costs.draft_cost == 0 and not policy.waiting.costs.charges_prefill
    twin = policy.fresh()  # another slot's: its own policies, the same costs
    assert twin.waiting is not policy.waiting and twin.waiting.costs == policy.waiting.costs and twin.costs is costs


@pytest.mark.parametrize("kwargs", [{"copy_n": 0}, {"copy_n": -1}, {"max_n": 1, "min_n": 2}, {"min_n": 0}])
def test_bad_arguments(tiny_draft, kwargs):
    with pytest.raises(SpecdecError):
        HybridDrafter(DraftModelDrafter(tiny_draft, TINY_VOCAB, 64), **kwargs)


def test_a_hybrid_prices_pooled_drafting_by_its_models_row_curve(tiny_draft):
    """A server's policy prices a pooled draft position by d(n) (Drafter.row_costs): the hybrid's is its
    model's (a head's ragged entries, timed), not the default of none (each row drafting alone)."""
    model = DraftModelDrafter(tiny_draft, TINY_VOCAB, 64)
    model.row_costs = lambda batches, context=256, repeats=5: {1: 1.0, **{n: 1.0 + 0.1 * n for n in batches}}
    assert HybridDrafter(model).row_costs([4, 16]) == {1: 1.0, 4: 1.4, 16: 2.6}


def test_the_builder_gives_a_drafter_that_waits_with_lookup_a_waiting_policy(tiny_target, tiny_draft, tmp_path,
                                                                            monkeypatch):
    """build_policy: a drafter that can draft by lookup while its model waits gets the waiting policy (free
    drafts over the same verify costs); a draft model alone, which waits plain, gets none."""
    import types
    from specdec.engine.build import build_policy
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    target = types.SimpleNamespace(module=tiny_target)
    model = DraftModelDrafter(tiny_draft, TINY_VOCAB, 64)
    waits = build_policy(HybridDrafter(model, copy_n=None), target, 3)
    assert waits.waiting is not None and waits.waiting.costs.verify_cost == waits.costs.verify_cost
    assert waits.waiting.costs.draft_cost == 0 and waits.costs.draft_cost > 0
    assert build_policy(model, target, 3).waiting is None


def test_a_server_round_mixes_waiting_lookups_and_started_drafts_and_keeps_greedy_output(tiny_target, tiny_draft,
                                                                                         monkeypatch):
    """Three slots (each its own policy and waiting one, as the builder makes them): a short prompt's draft
    starts at once, the long prompts' wait and draft by lookup, all verified in the same rounds (one
    width over rows of different policies); every answer is plain decoding's."""
    import specdec.engine.engine as engine_module
    from tests.conftest import run_engine
    rounds, width = [], engine_module.round_width

    def recorded(chosen):  # which policies planned each round's rows: the slot's own, or its waiting one
        rounds.append({p.waiting is None for p, _ in chosen})
        return width(chosen)
    monkeypatch.setattr(engine_module, "round_width", recorded)
    cfg = GenerationConfig(30, 4, SamplingParams())
    costs = CostModel({1: 1.0, 9: 1.0}, 0.1, prefill_cost=0.1)
    first = AdaptivePolicy(costs, PolicyConfig(k_max=4), AdaptivePolicy.lookup_while_waiting(costs, 4))
    drafters = []

    def factory():
        drafters.append(HybridDrafter(DraftModelDrafter(tiny_draft, TINY_VOCAB, 256), copy_n=None))
        return drafters[-1]
    prompts = [[5, 17, 3, 88, 41], [1, 2, 3, 4, 5, 6] * 7, list(range(30, 60)) + list(range(30, 45)), [9, 8, 7]]
    engine = Engine(tiny_target, factory, 256, max_batch=3, policy_factory=first.fresh)
    got = run_engine(engine, prompts, cfg, set())
    plain = Engine.single(tiny_target, NoDrafter(), 256)
    assert [got[i] for i in range(len(prompts))] == [plain.generate(p, cfg).tokens for p in prompts]
    assert sum(d.lookup_steps for d in drafters) > 0 and sum(d.model_steps for d in drafters) > 0
    assert {True, False} in rounds  # a round of started and waiting rows together
    assert all(p.waiting is not None for p in engine.pool.policies)
    assert len({id(p.waiting) for p in engine.pool.policies}) == 3
