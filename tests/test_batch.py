"""Batched, ragged verification: one forward for every sequence gives each the tokens it would get alone."""

import pytest
import torch

from specdec.config import GenerationConfig, SamplingParams
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.engine import Engine
from specdec.sampling.verify import ragged_inputs
from specdec.errors import SpecdecError
from tests.conftest import TINY_VOCAB, run_engine

PROMPTS = [[5, 17, 3, 88, 41], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 60)), [7], [9, 9, 9, 9, 9, 9]]


def test_ragged_forward_matches_per_row_forwards(tiny_target):
    """Rows at different lengths and widths: the batched logits equal each row's own forward."""
    cache = tiny_target.new_cache(64, batch=3)
    rows_prefix = [PROMPTS[0], PROMPTS[1], PROMPTS[2][:12]]
    for b, p in enumerate(rows_prefix):
        tiny_target(torch.tensor([p]), cache.row(b), 0)
    new = [[4, 5, 6], [8], [1, 2, 3, 4, 5]]
    tokens, slots, positions, mask = ragged_inputs([len(p) for p in rows_prefix], new, "cpu")
    logits = tiny_target(tokens, cache, 0, positions=positions, mask=mask, slots=slots)
    for b, (p, n) in enumerate(zip(rows_prefix, new)):
        ref = tiny_target(torch.tensor([p + n]), tiny_target.new_cache(64), 0)[0, len(p):]
        torch.testing.assert_close(logits[b, :len(n)], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("drafter", ["none", "ngram", "draft", "draft-on-device"])
def test_batched_greedy_equals_single_sequence(tiny_target, tiny_draft, drafter):
    factory = {"none": NoDrafter, "ngram": lambda: NgramDrafter(3, 1),
               "draft": lambda: DraftModelDrafter(tiny_draft, TINY_VOCAB, 256),
               "draft-on-device": lambda: DraftModelDrafter(tiny_draft, TINY_VOCAB, 256, on_device=True)}[drafter]
    cfg = GenerationConfig(30, 4)
    single = Engine.single(tiny_target, factory(), 256)
    expected = [single.generate(p, cfg).tokens for p in PROMPTS]
    stepper = Engine(tiny_target, factory, 256, max_batch=3)
    done = run_engine(stepper, PROMPTS, cfg, set(), limits=(None,))
    for i, p in enumerate(PROMPTS):
        assert done[i] == expected[i], i


def test_each_row_reports_the_rows_it_drafted_with(tiny_target, tiny_draft):
    """The policy reads a row's draft seconds as its share of the rows drafted together (Outcome.pooled):
    every row of a pooled draft model's round, and only the rows that drafted; a lookup drafter's rows
    draft alone."""
    from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig
    seen = []

    class Recording(AdaptivePolicy):
        def observe(self, outcome, num_accepted=None):
            seen.append((outcome.batch, outcome.num_drafted, outcome.pooled))
            super().observe(outcome, num_accepted)
    costs = CostModel({1: 1.0, 64: 1.0}, 0.01)  # drafting always pays: every row drafts
    for factory, alone in ((lambda: DraftModelDrafter(tiny_draft, TINY_VOCAB, 256), False),
                           (lambda: NgramDrafter(3, 1), True)):
        seen.clear()
        stepper = Engine(tiny_target, factory, 256, max_batch=3,
                         policy_factory=lambda: Recording(costs, PolicyConfig(k_max=4, prior=0.9)))
        run_engine(stepper, PROMPTS[:3], GenerationConfig(12, 4), set(), limits=(None,))
        drafted = [(b, p) for b, n, p in seen if n > 0]
        assert drafted and all(1 <= p <= b for b, p in drafted)
        assert all(p == 1 for _, p in drafted) if alone else any(p == 3 for _, p in drafted)


def test_batch_k_schedule_waiting_and_errors(tiny_target):
    stepper = Engine(tiny_target, lambda: NgramDrafter(3, 1), 64, max_batch=2)
    stepper.k_limit = 0
    b = stepper.add_request(PROMPTS[1], GenerationConfig(10, 4))
    while not stepper.step():
        pass
    assert b.stats.k_chosen[0] == b.stats.steps  # all plain
    assert b.finish_reason == "length" and not stepper.running  # out of its slot
    first, second, third = (stepper.add_request(PROMPTS[i], GenerationConfig(10, 4)) for i in (0, 1, 0))
    stepper.step()
    assert stepper.running == [first, second] and list(stepper.waiting) == [third]  # two slots: the third waits
    stepper.abort(first)
    assert first.finish_reason is None and sorted(stepper.pool.free) == [first.row]
    stepper.step()
    assert third in stepper.running and third.row == first.row and not stepper.waiting
    stepper.abort(third)
    stepper.abort(third)  # twice: nothing more
    with pytest.raises(SpecdecError, match="context"):
        stepper.add_request(PROMPTS[2], GenerationConfig(60, 4))
    assert not stepper.waiting


def test_batched_sampling_uses_each_requests_seed(tiny_target):
    cfg = GenerationConfig(20, 3, SamplingParams(0.9, seed=5))
    alone = Engine.single(tiny_target, NgramDrafter(3, 1), 256).generate(PROMPTS[1], cfg).tokens
    stepper = Engine(tiny_target, lambda: NgramDrafter(3, 1), 256, max_batch=2)
    a = stepper.add_request(PROMPTS[1], cfg)
    stepper.add_request(PROMPTS[0], GenerationConfig(20, 3, SamplingParams(0.9, seed=6)))
    while a not in stepper.step():
        pass
    assert a.new_tokens == alone
