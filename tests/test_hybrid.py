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


@pytest.mark.parametrize("kwargs", [{"copy_n": 0}, {"max_n": 1, "min_n": 2}, {"min_n": 0}])
def test_bad_arguments(tiny_draft, kwargs):
    with pytest.raises(SpecdecError):
        HybridDrafter(DraftModelDrafter(tiny_draft, TINY_VOCAB, 64), **kwargs)


def test_a_hybrid_prices_pooled_drafting_by_its_models_row_curve(tiny_draft):
    """A server's policy prices a pooled draft position by d(n) (Drafter.row_costs): the hybrid's is its
    model's (a head's ragged entries, timed), not the default of none (each row drafting alone)."""
    model = DraftModelDrafter(tiny_draft, TINY_VOCAB, 64)
    model.row_costs = lambda batches, context=256, repeats=5: {1: 1.0, **{n: 1.0 + 0.1 * n for n in batches}}
    assert HybridDrafter(model).row_costs([4, 16]) == {1: 1.0, 4: 1.4, 16: 2.6}
