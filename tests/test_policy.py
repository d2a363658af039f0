"""The speculation policy: cost model on synthetic curves, adaptation, probes, batch awareness."""

import json
import pytest

from specdec.config import GenerationConfig, SamplingParams
from specdec.drafters.base import END, GO_ON, LAST, NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from specdec.policy.costs import quadratic_part, round_draft_cost
from specdec.policy import (AdaptivePolicy, Ask, CostModel, Outcome, PolicyConfig, best_k, expected_tokens,
                            fit_prefill, interpolate, measure_costs, parse_schedule, round_width)
from tests.conftest import TINY_VOCAB, tiny_model

FLAT = CostModel({1: 1.0, 33: 1.0})  # verification free: a GPU at batch 1
CPU = CostModel({1: 1.0, 2: 1.25, 3: 1.27, 5: 1.27, 9: 1.47, 17: 1.82, 33: 2.27}, draft_cost=0.26)  # measured here
COMPUTE_BOUND = CostModel({1: 1.0, 8: 1.0, 64: 8.0})  # flat to 8 rows, then linear in rows


def test_interpolation_and_step_time():
    assert interpolate({1: 1.0, 3: 2.0}, 2) == 1.5
    assert interpolate({1: 1.0, 3: 2.0}, 5) == 3.0  # extrapolated along the last segment
    assert CPU.v(4) == pytest.approx(1.27)
    assert CPU.step_time(4) == pytest.approx(4 * 0.26 + 1.27)
    assert COMPUTE_BOUND.step_time(1, batch=16) == pytest.approx(16 * 0 + 4.0)


def test_expected_tokens_matches_the_iid_formula():
    a, k = 0.7, 5
    assert expected_tokens([a] * k, k) == pytest.approx((1 - a ** (k + 1)) / (1 - a))
    assert expected_tokens([0.0] * 4, 4) == 1.0 and expected_tokens([1.0] * 4, 4) == 5.0


def test_best_k_on_synthetic_curves():
    assert best_k([0.9] * 8, FLAT, 8)[0] == 8  # free verification, good drafts: the longest chain
    assert best_k([0.0] * 8, FLAT, 8)[0] == 0  # nothing accepted: plain (ties go to plain)
    assert best_k([0.3] * 8, CPU, 8)[0] == 0  # a 25% verify premium and 26% per draft: 0.3 does not pay
    k, rate = best_k([0.85] * 8, CPU, 8)
    assert 2 <= k <= 6 and rate > 1.0  # pays, but not at the longest chain
    # falling per-position acceptance shortens the chain
    assert best_k([0.95, 0.9, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2], CostModel({1: 1.0, 33: 1.0}, 0.1), 8)[0] == 2


def test_batch_awareness_turns_speculation_off_above_the_critical_batch():
    beta = [0.8] * 8
    assert best_k(beta, COMPUTE_BOUND, 8, batch=1)[0] > 0
    assert best_k(beta, COMPUTE_BOUND, 8, batch=16)[0] == 0  # 16 rows already fill the compute
    policy = AdaptivePolicy(COMPUTE_BOUND, PolicyConfig(k_max=8, prior=0.8))
    assert policy.choose(batch=1) > 0 and policy.choose(batch=16) == 0


def test_round_width_is_chosen_for_the_whole_batch():
    """Every row pads to the widest draft: a lone probe must not make all rows pay for its width."""
    costs = CostModel({1: 1.0, 8: 1.0, 64: 8.0})  # flat to 8 rows, then linear in rows
    sure, unsure = AdaptivePolicy(costs, PolicyConfig(k_max=4)), AdaptivePolicy(costs, PolicyConfig(k_max=4))
    sure.assume([0.95] * 4)
    unsure.assume([0.1] * 4)
    assert round_width([(sure, 4)]) == 5  # alone: its own choice
    assert round_width([(unsure, 2)] + [(unsure, 0)] * 15) == 1  # 16 rows: the probe waits
    assert round_width([(sure, 4)] * 2) == 5  # 10 rows still cost ~1 step: both draft 4
    assert round_width([(None, 3), (None, 0)]) == 4  # fixed k (no adaptive policy): the widest stands
    assert round_width([]) == 1


def test_a_pooled_draft_is_priced_by_its_row_curve():
    """A server's rows drafting together read the draft's weights once a position: a pooled draft model
    costs k c d(B), not B k c. Measured on a 2-core Zen 4: the 0.5B draft's 4-row forward costs 1.4 of one
    row's and its verify curve (1.5B target) as in CPU below: linear pricing turns drafting off at 4 rows,
    the row curve keeps it on."""
    rows = CostModel(CPU.verify_cost, CPU.draft_cost, draft_rows={1: 1.0, 4: 1.4, 16: 4.2})
    assert rows.d(1) == 1.0 and rows.d(4) == 1.4 and rows.d(10) == pytest.approx(2.8)
    assert CPU.d(4) == 4.0  # no curve: each row drafts on its own
    assert rows.step_time(4, batch=4) == pytest.approx(4 * 0.26 * 1.4 + rows.v(20))
    beta = [0.85] * 4
    assert best_k(beta, CPU, 4, batch=4)[0] == 0 and best_k(beta, rows, 4, batch=4)[0] > 0
    with pytest.raises(SpecdecError, match="d\\(1\\) = 1"):
        CostModel(CPU.verify_cost, 0.2, draft_rows={1: 2.0})
    with pytest.raises(SpecdecError, match="positive"):
        CostModel(CPU.verify_cost, 0.2, draft_rows={1: 1.0, 4: 0.0})


def test_round_width_prices_a_pooled_position_once_for_its_rows():
    """Four sure rows drafting 4: linear pricing (16 draft forwards) keeps them plain where the pooled
    row curve (4 forwards of 4 rows, 1.4 each) lets them draft; a position only some rows reach costs
    d(those rows)."""
    linear = CostModel(CPU.verify_cost, 0.4)
    pooled = CostModel(CPU.verify_cost, 0.4, draft_rows={1: 1.0, 2: 1.1, 4: 1.4})
    widths = []
    for costs in (linear, pooled):
        sure = AdaptivePolicy(costs, PolicyConfig(k_max=4))
        sure.assume([0.9] * 4)
        widths.append(round_width([(sure, 4)] * 4))
    assert widths[0] == 1 and widths[1] > 1
    # one row drafting 4, three drafting 1: positions 2..4 hold that row alone
    assert round_draft_cost(pooled, 0.4, [4, 1, 1, 1]) == pytest.approx(0.4 * (1.4 + 3 * 1.0))
    assert round_draft_cost(linear, 0.4, [4, 1, 1, 1]) == pytest.approx(0.4 * 7)
    assert round_draft_cost(pooled, 0.4, [0, 0]) == 0.0


def test_calibration_of_a_pooled_draft_reads_its_share_as_one_rows_forward():
    """In a pool of B rows drafting together each row's draft seconds are the pooled forwards' time over B,
    c d(B) / B of a plain step a position: calibrated back to c, not to c d(B) / B. B is the rows that
    drafted together, not the rows verified."""
    costs = CostModel(CPU.verify_cost, 0.25, step_seconds=0.1, draft_rows={1: 1.0, 4: 2.0})
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=4))
    policy.assume([0.8] * 4)
    for _ in range(12):
        policy.observe_time(4, 0.1 * 4 * 0.25 * 2.0 / 4, 0.1 * costs.v(20) / 4, batch=4, width=5, pooled=4)
    assert policy.draft_cost == pytest.approx(0.25, rel=0.02)
    two = AdaptivePolicy(CostModel(CPU.verify_cost, 0.25, step_seconds=0.1, draft_rows={1: 1.0, 2: 1.2, 4: 2.0}),
                         PolicyConfig(k_max=4))
    two.assume([0.8] * 4)
    for _ in range(12):  # 4 rows verified, 2 of them drafted (pooled): their share is of d(2), not d(4)
        two.observe_time(4, 0.1 * 4 * 0.25 * 1.2 / 2, 0.1 * CPU.v(20) / 4, batch=4, width=5, pooled=2)
    assert two.draft_cost == pytest.approx(0.25, rel=0.02)
    linear = AdaptivePolicy(CostModel(CPU.verify_cost, 0.25, step_seconds=0.1), PolicyConfig(k_max=4))
    linear.assume([0.8] * 4)
    for _ in range(12):  # each row drafting on its own: its seconds are its own forwards
        linear.observe_time(4, 0.1 * 4 * 0.25, 0.1 * CPU.v(20) / 4, batch=4, width=5)
    assert linear.draft_cost == pytest.approx(0.25, rel=0.02)


def test_fixed_schedule_overrides_the_model():
    policy = AdaptivePolicy(FLAT, PolicyConfig(k_max=8, schedule=parse_schedule("1:4,4:2,8:0")))
    assert [policy.choose(batch=b) for b in (1, 3, 4, 7, 8, 64)] == [4, 4, 2, 2, 0, 0]
    for bad in ("4", "a:b", "0:3", "1:-1", ""):
        with pytest.raises(SpecdecError):
            parse_schedule(bad)


def test_zero_acceptance_drives_the_policy_to_plain_within_a_few_steps():
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.9))
    drafting_steps = 0
    for _ in range(200):
        k = policy.choose()
        policy.observe(k, 0)
        if k == 0:
            break
        drafting_steps += 1
    assert drafting_steps <= 8
    # after that, only probes draft, and they come ever more rarely while they fail
    ks = []
    for _ in range(400):
        k = policy.choose()
        policy.observe(k, 0)
        ks.append(k)
    probes = [i for i, k in enumerate(ks) if k > 0]
    assert 3 <= len(probes) <= 12 and sum(ks) <= 2 * len(probes)
    # backed off: at the largest interval, the estimates drift back toward the prior only slowly
    assert probes[-1] - probes[-2] >= 32


def test_perfect_drafter_drives_the_policy_to_the_largest_k():
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.3, probe_first=False))
    assert policy.choose() == 0  # a pessimistic prior starts plain ...
    ks = []
    for _ in range(60):
        k = policy.choose()
        policy.observe(k, k)  # every draft accepted
        ks.append(k)
    assert ks[-1] == 8  # ... and a probe that passes brings it to the longest chain
    assert ks.index(8) <= 20


def test_policy_comes_back_when_the_text_turns_predictable():
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=6))
    for _ in range(50):
        k = policy.choose()
        policy.observe(k, 0)
    assert policy.choose() == 0 or policy.plain_run + 1 >= policy.interval
    for _ in range(150):  # a code block after prose: drafts start passing
        k = policy.choose()
        policy.observe(k, k)
    assert policy.choose() == 6


def test_a_position_that_failed_once_is_tried_again_when_drafts_keep_passing():
    """One rejection at position 2 must not freeze the policy at k = 1 while k = 1 always passes."""
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.95))
    k = policy.choose()
    assert k >= 2
    policy.observe(k, 1)  # position 2 rejected
    ks = []
    for _ in range(40):
        k = policy.choose()
        policy.observe(k, k)  # from now on every draft passes
        ks.append(k)
    assert ks[-1] == 8


def test_calibration_turns_a_drafter_dearer_than_the_curve_to_plain():
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, step_seconds=0.1)
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=4))
    beta = [0.7] * 4
    policy.assume(beta)
    k = policy.choose()
    assert k > 0  # the curve alone says drafting pays at 0.7
    for _ in range(10):  # but drafting really takes 3x the draft cost the curve gave
        policy.observe_time(k, 3 * 0.1 * k * costs.draft_cost, 0.1 * costs.v(k + 1))
    assert policy.draft_cost == pytest.approx(3 * costs.draft_cost, rel=0.1) and policy.rho_v == pytest.approx(1.0)
    assert policy.choose() == 0
    # a longer context slows every forward alike: plain and drafting keep their relative costs
    slow = AdaptivePolicy(costs, PolicyConfig(k_max=4))
    slow.assume(beta)
    for _ in range(10):
        slow.observe_time(k, 0.1 * k * costs.draft_cost, 2 * 0.1 * costs.v(k + 1))
        slow.observe_time(0, None, 2 * 0.1)
    assert slow.rho_v == pytest.approx(2.0, rel=0.05) and slow.rho_spec == pytest.approx(2.0, rel=0.05)
    assert slow.choose() > 0
    uncalibrated = AdaptivePolicy(CostModel(CPU.verify_cost, CPU.draft_cost), PolicyConfig(k_max=4))
    uncalibrated.observe_time(2, 10.0, 10.0)  # no step_seconds: nothing to calibrate against
    assert uncalibrated.rho_v == 1.0 and uncalibrated.draft_cost == CPU.draft_cost


def test_an_inflated_verify_calibration_drifts_back_while_plain_and_probes_resume():
    """rho_spec is measured only on drafted steps. After a slow spell made verifies look twice as dear
    as the curve says, no k pays and no probe runs (even a 0.9 drafter is predicted to lose); plain
    steps then let rho_spec drift back toward rho_v, and the policy probes again."""
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, step_seconds=0.1)
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=4, probe_first=False))
    policy.assume([0.8] * 4)
    policy.rho_v, policy.rho_spec = 0.65, 1.25  # verify/plain at about twice the curve's
    policy.recent.update(rho_v=[0.65, 0.65], rho_spec=[1.25, 1.25])  # as measured in that spell
    assert policy._best_k([0.9] * 4, 4)[0] == 0  # locked out: no probe can be justified
    chosen = []
    for _ in range(60):
        k = policy.choose()
        chosen.append(k)
        if k > 0:
            break
        policy.observe(k, 0)
        policy.observe_time(k, None, 0.065)
    assert chosen[-1] > 0 and len(chosen) < 60  # drafting (a probe) came back
    assert policy.rho_spec < 1.15  # drifted back toward rho_v while plain (no drafted step measured)
    for _ in range(3):  # drafted steps at the curve's cost: the median passes them from the second on
        policy.observe(1, 1)
        policy.observe_time(1, 0.1 * costs.draft_cost, 0.1 * 0.65 * costs.v(2))
    assert policy.rho_spec < 1.0


def test_a_drafted_step_dearer_than_the_curve_says_is_learned_apart_from_plain_steps():
    """Sampled verification (a softmax over the vocabulary per position) or a short context can make a
    drafted step cost more, relative to a plain one, than the offline curve says: the policy learns
    that apart (rho_spec) from the plain step's scale (rho_v), and a drafter near break-even goes plain."""
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, step_seconds=0.1)
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=4, probe_first=False))
    policy.assume([0.62] * 4)
    k = policy.choose()
    assert k > 0  # the curve says drafting pays (by more than the margin) at 0.62
    for _ in range(15):  # plain steps run at 0.9 of the curve's step, drafted ones at 1.3 of theirs
        policy.observe_time(0, None, 0.9 * 0.1)
        policy.observe_time(k, 0.1 * k * costs.draft_cost, 1.3 * 0.1 * costs.v(k + 1))
    assert policy.rho_v == pytest.approx(0.9, rel=0.05) and policy.rho_spec == pytest.approx(1.3, rel=0.05)
    assert policy.choose() == 0
    # a tree step and a row of a padded batch are multi-position verifies too
    for kwargs in ({"nodes": 8}, {"batch": 4, "width": 3}):
        p = AdaptivePolicy(costs, PolicyConfig(k_max=4, tree_sizes=(8,), tree_depth=4))
        n = kwargs.get("nodes", 0) + 1 if "nodes" in kwargs else 4 * 3
        for _ in range(15):
            p.observe_time(0 if "batch" in kwargs else 4, 0.01, 1.5 * 0.1 * costs.v(n) / (4 if "batch" in kwargs else 1),
                           **kwargs)
        assert p.rho_spec > 1.3 and p.rho_v == 1.0, kwargs


def test_plain_steps_let_the_estimates_drift_back_toward_the_prior():
    """While plain, nothing is observed: old evidence loses weight, so the estimates drift back
    toward the carried prior and the policy looks again, sooner than its probe interval, on text that
    turned predictable; after failed probes (a longer interval) the drift slows down."""
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.8, probe_first=False))
    for _ in range(4):
        policy.observe(2, 0)  # a bad patch
    low = policy.beta[0]
    assert policy.choose() == 0
    for _ in range(5):
        policy.observe(0, 0)
    assert low < policy.beta[0] < 0.8
    steps = next(i for i in range(100) if policy.choose() > 0 or policy.observe(0, 0))
    assert steps < policy.cfg.probe_every
    never = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.8, probe_first=False, plain_relax=0.0))
    for _ in range(4):
        never.observe(2, 0)
    for _ in range(10):
        never.observe(0, 0)
    assert never.beta[0] == pytest.approx(low)


def test_one_rejection_does_not_collapse_a_well_observed_chain():
    """Text the drafter knows (code): after many passing steps, one early rejection costs k at most 1-2."""
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.9))
    for _ in range(20):
        k = policy.choose()
        policy.observe(k, k)
    before = policy.choose()
    policy.observe(before, 1)  # position 2 rejected once
    assert before >= 7 and policy.choose() >= before - 2


def test_the_next_request_starts_from_what_earlier_requests_showed():
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.6))
    first = policy.choose()
    for _ in range(15):  # a request the drafter knows well
        k = policy.choose()
        policy.observe(k, k)
    policy.reset()
    assert policy.prior > 0.75 and policy.choose() > first  # the next one starts with a longer chain
    for _ in range(2):  # requests where nothing passes
        for _ in range(30):
            k = policy.choose()
            policy.observe(k, 0)
        policy.reset()
    assert policy.prior < 0.5 and policy.choose() == policy.cfg.probe_k  # ... the one after those opens with a
    policy.observe(policy.cfg.probe_k, 0)  # probe, and when that fails it goes plain at once
    assert [policy.choose() for _ in range(5)] == [0] * 5


def test_an_opening_probe_that_passes_starts_drafting_at_once():
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.3))
    assert best_k(policy.beta, CPU, 8)[0] == 0 and policy.choose() == policy.cfg.probe_k
    policy.observe(policy.cfg.probe_k, policy.cfg.probe_k)
    assert policy.choose() > 0  # no wait of probe_every plain steps
    policy.reset()
    policy.prior = 0.2
    assert policy.choose(batch=1) == policy.cfg.probe_k
    policy.observe(policy.cfg.probe_k, 0)  # a failed opening probe: plain, with probes backing off as before
    ks = []
    for _ in range(4 * policy.cfg.probe_every):
        ks.append(policy.choose())
        policy.observe(ks[-1], 0)
    assert ks[: policy.cfg.probe_every] == [0] * policy.cfg.probe_every and 1 <= sum(k > 0 for k in ks) <= 2


def test_admission_skips_a_draft_prefill_that_cannot_pay_back():
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, prefill_cost=0.01)  # 100 prompt tokens = 1 plain step
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=8, prior=0.6))
    assert policy.admit(100, 64)  # 1 step of prefill: within the learning allowance (3.2 steps)
    assert not policy.admit(2000, 64)  # 20 steps of prefill for a predicted saving of ~3: plain
    assert policy.admit(2000, 1024)  # the same prompt with a long answer pays back
    policy.assume([0.95] * 8)  # a drafter known to be good predicts a large saving
    assert policy.admit(2000, 64)
    free = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.0))  # lookup drafters: nothing to prefill
    assert free.admit(10 ** 6, 1)
    # under load the draft's prefill stalls every running sequence, and speculation saves less
    loaded = AdaptivePolicy(CostModel(COMPUTE_BOUND.verify_cost, 0.26, prefill_cost=0.01), PolicyConfig(k_max=8))
    loaded.assume([0.95] * 8)
    assert loaded.admit(100, 64, batch=1) and not loaded.admit(100, 64, batch=16)


def test_the_learning_allowance_backs_off_after_requests_whose_drafts_did_not_pay():
    """Adversarial traffic: each request's draft prefill fits the learning allowance, but drafting
    never pays. The allowance then skips 1, 2, 4, ... requests between tries, and never stops for
    good; one allowance request whose drafts pay restores it at once."""
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, prefill_cost=0.01)  # 100 prompt tokens = 1 plain step
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=8, prior=0.2, learn_backoff_max=8))
    admitted = []
    for _ in range(24):
        policy.reset()
        admitted.append(policy.admit(100, 64))  # no saving predicted at this prior: the allowance alone
        if admitted[-1]:
            policy.observe(1, 0)  # its probe fails
        policy.request_tokens = 63  # each answer runs to 64 tokens
    assert [i for i, a in enumerate(admitted) if a] == [0, 2, 5, 10, 19]
    policy.reset()
    policy.learn_skip = 0  # the next try comes
    assert policy.admit(100, 64) and policy.learning
    for _ in range(10):
        policy.observe(2, 2)  # this request's text suits the drafter
    policy.reset()
    assert policy.learn_backoff == 0 and policy.learn_skip == 0 and policy.admit(100, 64)
    assert not policy.admit(100, 64, batch=4)  # no allowance in a batch


def test_an_unadmitted_request_runs_plain_without_starting_the_drafter(tiny_target, tiny_draft):
    class Counting(DraftModelDrafter):
        starts = 0

        def start(self, prompt):
            Counting.starts += 1
            super().start(prompt)

    costs = CostModel(CPU.verify_cost, CPU.draft_cost, prefill_cost=1.0)  # prefill dearer than any saving
    engine = Engine.single(tiny_target, Counting(tiny_draft, TINY_VOCAB, 256), 256,
                                  AdaptivePolicy(costs, PolicyConfig(k_max=6, prior=0.9)))
    plain = Engine.single(tiny_target, NoDrafter(), 256)
    cfg = GenerationConfig(20, 6, SamplingParams())
    result = engine.generate(PROMPTS[2], cfg)
    assert result.tokens == plain.generate(PROMPTS[2], cfg).tokens
    assert Counting.starts == 0 and result.stats.drafted == 0 and result.stats.plain_fraction == 1.0
    # each plain step reported the target's confidence: a predicted acceptance per step
    assert engine.policy.request_shadow_trials == result.stats.steps > 0
    engine.policy.costs.prefill_cost = 0.0  # a free prefill is always admitted
    engine.generate(PROMPTS[2], cfg)
    assert Counting.starts == 1


def test_a_dear_draft_prefill_is_rented_before_it_is_bought():
    """Ski rental: a prefill that the predicted saving pays back, but not four times over, waits until
    the plain steps have lost as much as it costs; it is never bought when the tokens left cannot
    win it back. admit (for callers that decide once) commits when the saving covers it at all."""
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, prefill_cost=0.01)  # 1000 prompt tokens = 10 plain steps
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=8, prior=0.8))
    policy.reset()
    cost, per_token, _ = policy._prefill_terms(1000, 100, 1)
    assert cost == pytest.approx(10.0) and 0.30 < per_token < 0.33  # about 0.31 plain steps saved per token
    assert policy.admit(1000, 64)  # 64 x 0.31 = 20 > 10: the server commits
    assert not policy.start_now(1000, 0, 100) and not policy.start_now(1000, 0, 64)  # not 4x over: rent
    assert policy.start_now(1000, 0, 200)  # 200 x 0.31 = 63 > 4 x 10: committed to at once
    starts = [g for g in range(1, 100) if policy.start_now(1000 + g, g, 100)]
    # 34 plain steps have lost 34 x 0.313 = 10.6 >= the prefill of 1034 tokens (10.34); 33 had not;
    # from about token 67 on, the tokens left cannot win the prefill back
    assert starts == list(range(34, starts[-1] + 1)) and 60 < starts[-1] < 70
    assert not any(policy.start_now(1000 + g, g, 64) for g in range(1, 64))  # 64 at most: never pays
    assert policy.start_now(50, 0, 128)  # a short prompt's prefill (0.5 steps) is committed to at once
    weak = AdaptivePolicy(costs, PolicyConfig(k_max=8, prior=0.2))  # no saving predicted
    weak.reset()
    assert weak.start_now(100, 0, 64) and weak.learning  # the learning allowance, at the start only
    assert not any(weak.start_now(100 + g, g, 64) for g in range(1, 64))
    assert AdaptivePolicy(costs, PolicyConfig(commit_share=1.0, prior=0.8)).start_now(1000, 0, 64)  # no rent


def test_a_deferred_drafter_starts_mid_answer_and_stays_exact(tiny_target, tiny_draft):
    class Counting(DraftModelDrafter):
        starts = []

        def start(self, prompt):
            Counting.starts.append(len(prompt))
            super().start(prompt)

    # the rule alone: the tiny target's low confidence on its plain tokens would lower the estimate
    policy = AdaptivePolicy(CostModel(CPU.verify_cost, CPU.draft_cost, prefill_cost=1.0),
                            PolicyConfig(k_max=6, prior=0.9, target_signal=False))
    policy.reset()
    per_token = policy._prefill_terms(29, 20, 1)[1]
    policy.costs.prefill_cost = 6 * per_token / 29  # the prompt's prefill (29 tokens) costs 6 tokens' saving
    engine = Engine.single(tiny_target, Counting(tiny_draft, TINY_VOCAB, 256), 256, policy)
    plain = Engine.single(tiny_target, NoDrafter(), 256)
    cfg = GenerationConfig(20, 6, SamplingParams())
    result = engine.generate(PROMPTS[2], cfg)  # 30 tokens
    assert result.tokens == plain.generate(PROMPTS[2], cfg).tokens
    # 6 > 20 / 4: rent; 8 plain tokens lose 8 x s >= the prefill of 37 tokens, 6 x 37 / 29 x s
    assert result.stats.draft_started_at == 8 and Counting.starts == [38]  # prompt + 8 new tokens
    assert result.stats.k_chosen[0] >= 7 and result.stats.drafted > 0
    assert result.stats.summary()["draft_started_at"] == 8
    adm = result.stats.summary()["draft_admission"]  # what the refusal at the start rested on
    assert adm["admitted"] is False and adm["prefill_cost"] == pytest.approx(6 * per_token, rel=1e-2)
    assert adm["horizon"] == 20 and adm["share"] == policy.cfg.commit_share
    fresh = Engine.single(tiny_target, Counting(tiny_draft, TINY_VOCAB, 256), 256, policy)
    short = fresh.generate(PROMPTS[2], GenerationConfig(8, 6, SamplingParams()))  # too short to pay: never
    assert short.stats.draft_started_at is None and short.stats.drafted == 0 and len(Counting.starts) == 1
    # the first engine's draft still holds this prompt's text: its prefill is free, so it starts at once
    again = engine.generate(PROMPTS[2], GenerationConfig(8, 6, SamplingParams()))
    assert again.stats.draft_started_at == 0 and Counting.starts == [38, 30]
    hybrid = Engine.single(tiny_target, HybridDrafter(DraftModelDrafter(tiny_draft, TINY_VOCAB, 256)), 256,
                                  AdaptivePolicy(policy.costs, PolicyConfig(k_max=6, prior=0.9)))
    for prompt in PROMPTS:  # lookup drafts while the model waits, then both
        assert hybrid.generate(prompt, cfg).tokens == plain.generate(prompt, cfg).tokens


def test_bad_policy_config_is_refused():
    for kwargs in ({"k_max": 0}, {"prior": 1.5}, {"decay": 0.0}, {"probe_every": 10, "probe_every_max": 5},
                   {"prior_weight": 0.0}, {"memory": 1.5}, {"learn_budget": -1.0}, {"learn_backoff_max": -1},
                   {"commit_share": -0.1}, {"commit_share": 1.5}, {"shadow_weight": -0.5},
                   {"shadow_decay": 0.0}, {"shadow_decay": 1.5}):
        with pytest.raises(SpecdecError):
            PolicyConfig(**kwargs)
    with pytest.raises(SpecdecError):
        CostModel({2: 1.0})


def test_measured_costs_are_positive(tiny_target, tiny_draft):
    costs = measure_costs(tiny_target, tiny_draft, sizes=(1, 2, 5), context=16, repeats=2)
    assert costs.verify_cost[1] == 1.0 and all(v > 0 for v in costs.verify_cost.values()) and costs.draft_cost > 0
    assert costs.prefill(16) > 0 and costs.prefill_fixed >= 0
    lookup = measure_costs(tiny_target, None, sizes=(1, 2), context=16)
    assert lookup.prefill(16) == 0 and lookup.prefill_fixed == 0
    assert costs.draft_rows == {1: 1.0} and lookup.draft_rows == {1: 1.0}  # no pool asked for: each row alone
    pooled = measure_costs(tiny_target, tiny_draft, sizes=(1, 2), context=16, repeats=2, batches=(2, 8))
    d = pooled.draft_rows
    assert sorted(d) == [1, 2, 8] and d[1] == 1.0 and 0 < d[2] <= d[8]  # more rows never cost less


PROMPTS = [[5, 17, 3, 88, 41], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 60))]


@pytest.mark.parametrize("which", ["draft", "ngram", "pmin"])
def test_adaptive_and_early_stop_stay_greedy_exact(tiny_target, tiny_draft, which):
    plain = Engine.single(tiny_target, NoDrafter(), 256)
    drafter = {"draft": lambda: DraftModelDrafter(tiny_draft, TINY_VOCAB, 256),
               "ngram": lambda: NgramDrafter(3, 1),
               "pmin": lambda: DraftModelDrafter(tiny_target, TINY_VOCAB, 256, p_min=0.5)}[which]()
    policy = None if which == "pmin" else AdaptivePolicy(CPU, PolicyConfig(k_max=6))
    engine = Engine.single(tiny_target, drafter, 256, policy)
    for prompt in PROMPTS:
        cfg = GenerationConfig(40, 6, SamplingParams())
        expected = plain.generate(prompt, cfg).tokens
        result = engine.generate(prompt, cfg)
        assert result.tokens == expected
        assert sum(result.stats.k_chosen) == result.stats.steps
        if which == "pmin":  # the target drafting for itself: what it drafts passes, but it stops when unsure
            assert result.stats.alpha == 1.0 and result.stats.drafted < 6 * result.stats.steps


def test_adaptive_goes_plain_with_a_useless_drafter(tiny_target, tiny_draft):
    """The 1-layer random draft rarely agrees with the target: the policy ends up mostly plain."""
    engine = Engine.single(tiny_target, DraftModelDrafter(tiny_draft, TINY_VOCAB, 256), 256,
                                  AdaptivePolicy(CPU, PolicyConfig(k_max=6)))
    stats = engine.generate(PROMPTS[2], GenerationConfig(120, 6, SamplingParams())).stats
    assert stats.plain_fraction > 0.5, stats.k_chosen


def test_bad_p_min_is_refused(tiny_draft):
    with pytest.raises(SpecdecError, match="p_min"):
        DraftModelDrafter(tiny_draft, TINY_VOCAB, 64, p_min=1.0)


def test_a_chain_accepted_to_its_end_extends_k_by_more_than_one():
    """A request's first chains pass in full: k reaches the longest chain within three steps, where
    a prior stuck at the pooled rate for unobserved positions would climb one position at a time."""
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.6))
    ks = []
    for _ in range(3):
        ks.append(policy.choose())
        policy.observe(ks[-1], ks[-1])
    assert ks[0] >= 1 and ks[1] >= ks[0] + 2 and policy.choose() == 8
    # ... and an unreached position still starts from no more than the last reached one showed
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.6))
    policy.assume([0.9, 0.3])
    beta = policy.beta
    assert beta[1] == pytest.approx(0.3, abs=0.01) and beta[2] < 0.7


FLAT = CostModel({1: 1.0, 33: 1.05}, draft_cost=0.05)  # a GPU-like curve: 33 positions cost one step


def tree_policy(costs, **kw):
    return AdaptivePolicy(costs, PolicyConfig(k_max=8, tree_sizes=(4, 8, 16), tree_depth=4, **kw))


def test_trees_are_chosen_where_positions_are_cheap_and_chains_where_they_are_not():
    gpu, cpu = tree_policy(FLAT), tree_policy(CPU)
    for p in (gpu, cpu):
        p.assume([0.8] * 8)
        for n, a in ((4, 0.85), (8, 0.88), (16, 0.9)):  # larger trees pass more often, depth by depth
            p.tree_hits[n], p.tree_trials[n] = [1000 * a] * 4, [1000.0] * 4
    cpu.tree_cost = {n: 0.55 for n in cpu.tree_cost}  # a tree depth's drafting as measured here (trees.md)
    assert gpu.choose_action() == (4, 16)  # 17 positions cost about one step: the largest tree
    k, nodes = cpu.choose_action()
    assert nodes is None and k >= 3  # here 17 positions cost 1.8 steps: a chain
    assert gpu.choose_action(batch=4)[1] is None  # trees are verified alone: never in a batch
    assert gpu.choose_action(nodes_cap=8) == (4, 8) and gpu.choose_action(k_cap=2) == (2, 16)


def test_a_tree_size_that_fails_gives_way_to_the_chain_and_the_estimates_carry_the_outcome():
    p = tree_policy(FLAT)
    p.assume([0.7] * 8)
    assert p.choose_action()[1] is not None  # untried trees start optimistic: worth a try
    for step in range(30):
        k, nodes = p.choose_action()
        if nodes is None:
            break
        p.observe_tree(nodes, k, 0)  # no tree path ever passes
    assert nodes is None and k >= 1 and step <= 8  # back to the chain within a few steps
    assert p.tree_beta(16)[0] < 0.5
    before = p.tree_beta(8)[0]
    p.observe_tree(8, 4, 4)
    assert p.tree_beta(8)[0] > before and p.opening is False
    with pytest.raises(SpecdecError, match="tree sizes"):
        PolicyConfig(tree_sizes=(1,), tree_depth=4)


def test_tree_drafter_under_the_policy_is_exact_and_uses_both_shapes(tiny_target, tiny_draft):
    """The draft model configured for trees, the policy choosing chain / tree / plain per step on a flat
    cost curve: greedy output equals plain decoding, and both trees and chains were proposed."""
    from specdec.config import TreeConfig
    prompts = [[5, 17, 3, 88, 41, 5, 17], [1, 2, 3, 1, 2, 3, 1, 2]]
    cfg = GenerationConfig(40, 8)
    plain = Engine.single(tiny_target, NoDrafter(), 256)
    drafter = DraftModelDrafter(tiny_draft, TINY_VOCAB, 256, tree=TreeConfig(16, 4, 4))
    assert drafter.tree_actions() == {"tree_sizes": (4, 8, 16), "tree_depth": 4}
    policy = AdaptivePolicy(CostModel({1: 1.0, 17: 1.0, 33: 1.6}, draft_cost=0.05),
                            PolicyConfig(k_max=8, prior=0.5, **drafter.tree_actions()))
    engine = Engine.single(tiny_target, drafter, 256, policy)
    shapes = []
    original = drafter.propose
    drafter.propose = lambda state: shapes.append(state.tree) or original(state)
    for p in prompts:
        assert engine.generate(p, cfg).tokens == plain.generate(p, cfg).tokens
    assert True in shapes and False in shapes


def test_a_policy_that_has_only_seen_trees_pass_tries_the_chain():
    """Trees that pass raise the chain's estimate too (the pooled rate): where chains are cheaper
    (this CPU's curve, trees' drafting dear), the policy moves on to a chain."""
    p = tree_policy(CPU, prior=0.3)
    p.tree_cost = {n: 0.55 for n in p.tree_cost}
    p.tree_hits = {n: [1.0] * 4 for n in p.tree_hits}  # trees seen passing once, chain never tried
    p.tree_trials = {n: [1.0] * 4 for n in p.tree_trials}
    shapes = []
    for _ in range(12):
        k, nodes = p.choose_action()
        shapes.append(nodes)
        if nodes is None:
            p.observe(k, k)
        else:
            p.observe_tree(nodes, k, k)
    assert shapes[-1] is None and p.beta[0] > 0.8


def test_tree_actions_of_a_static_tree_and_of_a_chain_drafter(tiny_draft):
    from specdec.config import TreeConfig
    static = DraftModelDrafter(tiny_draft, TINY_VOCAB, 64, tree=TreeConfig(choices=((0,), (1,), (0, 0), (0, 0, 0))))
    assert static.tree_actions() == {"tree_sizes": (4,), "tree_depth": 3}
    assert DraftModelDrafter(tiny_draft, TINY_VOCAB, 64).tree_actions() == {}


def test_policy_sim_overrides_are_typed_and_refuse_bad_input():
    from scripts.policy_sim import parse_overrides
    assert parse_overrides(["decay=0.1", "probe_k=2"]) == {"decay": 0.1, "probe_k": 2}
    for bad in (["decay"], ["nope=1"], ["probe_k=two"], ["schedule=1:4"], ["probe_first=false"]):
        with pytest.raises(ValueError, match="--set"):
            parse_overrides(bad)


# ---- the confidence rule: draft while the draft's own confidence predicts a gain ----

def draft_with_rule(policy: AdaptivePolicy, k_cap: int, confidences: list[float]) -> tuple[int, int]:
    """choose(), then the drafter's loop under the rule over these confidences: (k chosen, drafted)."""
    k = policy.choose(k_cap=k_cap)
    cap, stop = policy.confident_draft(k, k_cap)
    if stop is None:
        return k, k
    n = 0
    while n < cap:
        decision = stop(n, confidences[min(n, len(confidences) - 1)])
        n += decision != END
        if decision != GO_ON:
            break
    return k, n


def test_confidence_bins_start_calibrated_and_learn_from_outcomes():
    policy = AdaptivePolicy(FLAT, PolicyConfig(k_max=8))  # free verification: it always drafts
    assert policy.confidence_rate(0.99) == pytest.approx(0.99) and policy.confidence_rate(0.1) == pytest.approx(0.1)
    for _ in range(30):  # a draft sure of tokens the target rejects
        k, n = draft_with_rule(policy, 8, [0.99])
        policy.observe(n, 0)
    assert policy.confidence_rate(0.99) < 0.3 and policy.confidence_rate(0.5) == pytest.approx(0.55)


def test_the_rule_drafts_confident_tokens_past_k_and_stops_at_an_unsure_one():
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8))
    k, n = draft_with_rule(policy, 8, [0.995] * 5 + [0.15])
    # the prior's k, lengthened by confidence; the unsure sixth token is still verified (its draft
    # forward is spent, a verify position costs little), but no forward is run after it
    assert 0 < k < 5 and n == 6 and policy.step_stopped is False
    dear = AdaptivePolicy(CostModel({1: 1.0, 2: 1.1, 9: 4.0}, 0.1), PolicyConfig(k_max=8))
    k, n = draft_with_rule(dear, 8, [0.995] * 3 + [0.15])
    assert n == 3 and dear.step_stopped  # dear verify positions: the unsure token is not even verified
    dear.observe(n, n)  # all three passed: the look at position 4 found nothing worth drafting
    assert dear.trials[3] == pytest.approx(1.0) and dear.hits[3] == 0.0 and dear.hits[2] == pytest.approx(1.0)
    _, cap_stop = policy.choose(), policy.confident_draft(0, 8)
    assert cap_stop == (0, None)  # a plain choice gets no rule


def test_the_rule_prices_a_rounds_tokens_at_its_batch():
    """In a round of 4 rows a draft position is one pooled forward over them, c d(4), and a token each
    row drafts adds 4 verify positions to the round every row waits on: the rule weighs each token
    against those, as choose() prices the round (a row's rate is its tokens per round time)."""
    def rule(verify: dict, rows: dict, batch: int) -> int:
        policy = AdaptivePolicy(CostModel(verify, 0.3, draft_rows=rows), PolicyConfig(k_max=8))
        policy.rate = 1.0  # what choose() left: a row's tokens per unit of round time
        _, stop = policy.confident_draft(1, 2, batch)
        return stop(0, 0.9)  # the first token (its forward spent): draft it, and go on to a second?
    flat, pooled = {1: 1.0, 16: 1.0}, {1: 1.0, 4: 1.0}
    assert rule(flat, {1: 1.0}, 1) == GO_ON  # a second token, passing about 0.9 x 0.9, beats c = 0.3
    assert rule(flat, {1: 1.0, 4: 4.0}, 4) == LAST  # four rows drafting one by one: a position costs 4 c
    assert rule(flat, pooled, 4) == GO_ON  # pooled at no extra cost: as one row
    dear = {1: 1.0, 4: 1.0, 8: 3.0, 12: 5.0}
    assert rule(dear, pooled, 1) == GO_ON  # one row: 2 and 3 positions verify at one step's cost
    assert rule(dear, pooled, 4) == END  # four rows: a token each adds 4 positions, 2 steps to the round
    seen = []

    class Spy(AdaptivePolicy):
        def confident_draft(self, k, k_cap, batch=1):
            seen.append(batch)
            return super().confident_draft(k, k_cap, batch)
    Spy(CostModel(flat, 0.3, draft_rows=pooled), PolicyConfig(k_max=8)).plan(Ask(2, 4, None, True))
    assert seen == [4]  # the engine's round batch reaches the rule


def test_a_look_that_stops_before_its_first_token_is_a_failed_look_not_a_plain_step():
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.9))
    k, n = draft_with_rule(policy, 8, [0.03])
    assert k > 0 and n == 0
    policy.observe(0, 0)
    assert policy.plain_run == 0 and policy.trials[0] == pytest.approx(1.0) and policy.hits[0] == 0.0
    assert policy.last_looked == 1


def test_a_confident_drafter_that_is_always_wrong_goes_plain_within_a_few_steps():
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.9))
    drafting = 0
    for _ in range(100):
        k, n = draft_with_rule(policy, 8, [0.99])
        policy.observe(n, 0)
        if k == 0:
            break
        drafting += 1
    assert drafting <= 8


def test_a_perfect_confident_drafter_drafts_to_the_cap_from_the_first_step():
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.3, probe_first=False))
    assert policy.choose() == 0
    drafted = []
    for _ in range(30):
        k, n = draft_with_rule(policy, 8, [0.99])
        policy.observe(n, n)
        drafted.append(n)
    assert drafted[-1] == 8 and drafted.index(8) <= 10


def test_the_rule_is_off_when_configured_off_or_scheduled():
    for cfg in (PolicyConfig(confidence=False), PolicyConfig(schedule={1: 3})):
        policy = AdaptivePolicy(CPU, cfg)
        k = policy.choose()
        assert policy.confident_draft(k, 8) == (k, None)


def test_the_rule_in_the_engine_is_greedy_exact_and_lengthens_and_ends_chains():
    """A target drafting for itself with a sharpened head (often sure, sometimes not): everything
    drafted passes; chains grow past the k the position estimates chose, and some end early."""
    import torch
    target = tiny_model(0)
    with torch.no_grad():
        target.lm_head.weight.mul_(3.0)
    stops = []

    class Counting(AdaptivePolicy):
        def confident_draft(self, k, k_cap, batch=1):
            cap, stop = super().confident_draft(k, k_cap, batch)
            if stop is None:
                return cap, stop

            def counted(i, p):
                out = stop(i, p)
                stops.append((k, i, out == END))
                return out
            return cap, counted

    plain = Engine.single(target, NoDrafter(), 256)
    engine = Engine.single(target, DraftModelDrafter(target, TINY_VOCAB, 256), 256,
                                  Counting(CPU, PolicyConfig(k_max=6)))
    for prompt in PROMPTS:
        cfg = GenerationConfig(40, 6, SamplingParams())
        result = engine.generate(prompt, cfg)
        assert result.tokens == plain.generate(prompt, cfg).tokens
        assert result.stats.alpha == 1.0
    assert any(out for _, _, out in stops)  # some chains ended by doubt ...
    assert any(i >= k and not out for k, i, out in stops)  # ... and some grew past the chosen k


def test_bad_confidence_config_is_refused():
    for kwargs in ({"conf_weight": 0.0}, {"conf_decay": 0.0}, {"conf_decay": 1.5}, {"margin": -0.1}, {"margin": 1.0}):
        with pytest.raises(SpecdecError):
            PolicyConfig(**kwargs)


def _run_request(policy: AdaptivePolicy, new_tokens: int) -> None:
    """A request of new_tokens tokens (the prefill's one and new_tokens - 1 plain steps)."""
    policy.reset()
    for _ in range(new_tokens - 1):
        policy.observe(0, 0)


def test_admission_weighs_the_draft_prefill_against_the_answers_seen_not_max_new_tokens():
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, step_seconds=0.3, prefill_cost=0.02)
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=8, prior=0.8))
    policy.reset()
    assert policy.admit(500, 64)  # 10 steps of prefill against a saving predicted over 64 tokens
    for _ in range(3):  # answers of about 12 tokens (RAG, QA): a saving over 12 tokens cannot pay
        _run_request(policy, 12)
    policy.reset()
    assert policy.expected_new == pytest.approx(12, abs=1.0) and not policy.admit(500, 64)
    assert policy.admit(50, 64)  # a short prompt's prefill still pays
    for _ in range(3):  # long answers again: admitted again
        _run_request(policy, 64)
    policy.reset()
    assert policy.admit(500, 64) and policy.admit(500, 16) is False


def test_measured_draft_prefills_calibrate_admission():
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, step_seconds=0.3, prefill_cost=0.02)
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=8, prior=0.8))
    policy.reset()
    assert policy.admit(500, 64)
    for _ in range(5):  # prefills three times dearer than the profile says
        policy.observe_prefill(500, 3 * 0.3 * 0.02 * 500)
    assert policy.rho_prefill > 2.5 and not policy.admit(500, 64)
    policy.observe_prefill(500, 0.0)  # a broken timing is ignored
    assert policy.rho_prefill > 2.5


def test_the_prefill_price_is_a_fixed_part_plus_a_part_per_token():
    assert fit_prefill((64, 2.2), (512, 11.2)) == (pytest.approx(0.914, abs=1e-3), pytest.approx(0.02009, abs=1e-5))
    assert fit_prefill((64, 3.0), (512, 2.0)) == (3.0, 0.0)  # noise that says "shorter is dearer": flat
    with pytest.raises(SpecdecError):
        fit_prefill((512, 1.0), (64, 2.0))
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, prefill_cost=0.02, prefill_fixed=0.9)
    assert costs.prefill(0) == 0.0 and costs.prefill(100) == pytest.approx(2.9)
    with pytest.raises(SpecdecError):
        CostModel(CPU.verify_cost, prefill_fixed=-1.0)


def test_a_long_prefill_adds_attention_s_square_to_the_price():
    """Measured on the 0.5B draft (plain steps): 1.5 at 32 tokens, 4.6 at 128, 54.5 at 1024; the affine
    part through the short two says 33.3 at 1024, so the rest is a part per token squared, and a 2k
    prompt (measured 145.4) is priced within 10% of it rather than at the affine 66."""
    fixed, per_token = fit_prefill((32, 1.5), (128, 4.6))
    quadratic = quadratic_part(fixed, per_token, (1024, 54.5))
    assert quadratic == pytest.approx((54.5 - fixed - per_token * 1024) / 1024 ** 2)
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, prefill_cost=per_token, prefill_fixed=fixed,
                      prefill_quadratic=quadratic)
    assert costs.prefill(1024) == pytest.approx(54.5) and costs.prefill(32) == pytest.approx(1.5, abs=0.03)
    assert costs.prefill(2048) == pytest.approx(145.4, rel=0.1) and fixed + per_token * 2048 < 70
    assert quadratic_part(fixed, per_token, (1024, 20.0)) == 0.0  # no dearer than the affine price: none
    with pytest.raises(SpecdecError, match="prefill length must be positive"):
        quadratic_part(fixed, per_token, (0, 1.0))
    with pytest.raises(SpecdecError):
        CostModel(CPU.verify_cost, prefill_quadratic=-1e-6)
    profile = {"verify_cost": {"1": 1.0, "5": 1.3}, "draft_cost_ratio": 0.4, "draft_prefill_cost": per_token,
               "draft_prefill_fixed": fixed, "draft_prefill_quadratic": quadratic}
    assert CostModel.from_profile(profile).prefill(1024) == pytest.approx(54.5)


def test_an_old_profile_s_prefill_price_is_split_into_the_draft_s_weight_read_and_the_rest():
    old = {"verify_cost": {"1": 1.0, "5": 1.3}, "draft_cost_ratio": 0.4, "draft_prefill_cost": 0.0156,
           "context": 512, "step_seconds": 0.2}
    costs = CostModel.from_profile(old)
    assert costs.prefill_fixed == pytest.approx(0.4) and costs.prefill(512) == pytest.approx(0.0156 * 512)
    new = dict(old, draft_prefill_fixed=0.9, draft_prefill_cost=0.02)
    assert CostModel.from_profile(new).prefill(100) == pytest.approx(2.9)
    assert CostModel.from_profile(old, draft_model=False).prefill(100) == 0.0
    assert costs.draft_rows == {1: 1.0}  # a profile without d(n): each row priced alone, as before
    pooled = dict(new, draft_rows={"1": 1.0, "4": 1.5})
    assert CostModel.from_profile(pooled).d(4) == 1.5 and CostModel.from_profile(pooled, draft_model=False).d(4) == 4


def test_the_learning_allowance_pays_a_prefill_s_fixed_part_and_bounds_the_rest():
    """On a host where any draft prefill costs 1.4 plain steps before its first token,
    a 5% allowance of a 64-token answer (3.2 steps) admitted no prompt over 60 tokens, so a low
    carried prior was never tested again. The allowance now bounds the part per token."""
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, prefill_cost=0.03, prefill_fixed=1.4)
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=8, prior=0.3))  # a prior under which nothing pays
    policy.reset()
    assert policy._prefill_terms(100, 64, 1)[1] == 0.0  # no saving predicted: the allowance alone
    assert policy.admit(100, 64) and policy.learning  # 1.4 + 3.0 steps: the fixed part + 3.0 <= 3.2
    policy.reset()
    assert not policy.admit(120, 64)  # 1.4 + 3.6: the part per token is over the allowance
    assert not policy.admit(10, 64, batch=2)  # no allowance in a batch


def test_the_learning_allowance_is_a_share_of_the_answer_expected_not_of_the_budget():
    """After answers of 20 tokens, a long prompt's draft prefill is not admitted on the allowance at a
    512-token budget (5% of 512 steps would cover a 700-token RAG prompt every time); the ski rental
    still starts it once an answer runs long enough."""
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, prefill_cost=0.03, prefill_fixed=0.2)
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=8, prior=0.8))
    policy.reset()
    assert policy.admit(700, 512)  # no answer seen yet: the budget is the horizon
    policy.expected_new = 20.0
    policy.reset()
    assert not policy.admit(700, 512) and not policy.start_now(700, 0, 512)  # 21 steps against 0.2 + 1.0
    assert policy.admit(20, 512)  # a short prompt is still admitted
    per_token = policy._prefill_terms(700, 512, 1)[1]
    assert not policy.start_now(700, 20, 512) and policy.start_now(700, int(21.2 / per_token) + 1, 512)


def test_a_profile_with_bad_prefill_prices_is_refused_clearly(tmp_path):
    from specdec.policy import load_profile
    good = {"verify_cost": {"1": 1.0, "5": 1.3}, "draft_cost_ratio": 0.4, "draft_prefill_cost": 0.02,
            "draft_prefill_fixed": 0.6, "context": 512, "step_seconds": 0.2}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(good))
    assert CostModel.from_profile(load_profile(str(path))).prefill(100) == pytest.approx(2.6)
    path.write_text(json.dumps(dict(good, draft_prefill_fixed="fast")))
    with pytest.raises(SpecdecError, match="profile"):
        load_profile(str(path))
    for rows in ({"1": 1.0, "4": "fast"}, ["1", "4"]):  # a pooled draft's row curve that is not one
        path.write_text(json.dumps(dict(good, draft_rows=rows)))
        with pytest.raises(SpecdecError, match="profile"):
            load_profile(str(path))
    path.write_text(json.dumps(dict(good, draft_rows={"1": 1.0, "4": 1.5})))
    assert CostModel.from_profile(load_profile(str(path))).d(4) == 1.5
    path.write_text(json.dumps(dict(good, draft_rows={"1": 2.0, "4": 1.5})))  # d(1) must be 1
    with pytest.raises(SpecdecError, match="d\\(1\\) = 1"):
        CostModel.from_profile(load_profile(str(path)))
    path.write_text(json.dumps(dict(good, draft_prefill_fixed=-1.0)))
    with pytest.raises(SpecdecError, match="positive"):
        CostModel.from_profile(load_profile(str(path)))


def test_prefills_priced_affinely_calibrate_alike_at_every_prompt_length():
    """Short prompts' prefills are mostly the fixed part. Priced by the token alone they read as
    dear (rho_prefill well above 1), and a long prompt after them is then priced at twice its cost:
    a refusal of a long code prompt. Priced affinely, both lengths agree."""
    t1 = 0.3
    real = lambda n: t1 * (0.9 + 0.02 * n)  # seconds of a prefill on this "machine"
    for fixed, drift in ((0.0, True), (0.9, False)):
        per_token = 0.02 if fixed else (0.9 + 0.02 * 512) / 512  # the linear price: right at 512 tokens
        policy = AdaptivePolicy(CostModel(CPU.verify_cost, CPU.draft_cost, step_seconds=t1, prefill_cost=per_token,
                                          prefill_fixed=fixed), PolicyConfig(k_max=8))
        for _ in range(20):
            policy.observe_prefill(40, real(40))
        assert (policy.rho_prefill > 1.8) == drift  # 1.0 when priced right
        priced = policy._prefill_terms(512, 64, 1)[0]
        assert (priced > 1.5 * (0.9 + 0.02 * 512)) == drift


def test_no_drafting_at_break_even():
    """A prediction a few percent above plain is as likely a loss as a gain: the margin keeps it plain."""
    beta = [0.56] * 8  # k = 1 predicts (1 + 0.56) / (0.26 + 1.25) = 1.03x plain on the CPU curve
    assert best_k(beta, CPU, 8)[0] >= 1 and best_k(beta, CPU, 8, margin=0.05) == (0, pytest.approx(1.0))
    for margin, drafts in ((0.0, True), (0.05, False)):
        policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, margin=margin, probe_first=False))
        policy.assume(beta)
        assert (policy.choose() > 0) == drafts
    assert best_k([0.9] * 8, CPU, 8, margin=0.05)[0] >= 4  # a clear gain still drafts


def test_a_probe_under_the_confidence_rule_drafts_while_the_draft_is_confident():
    """While plain, a probe is a look judged against plain decoding's rate: a confident draft probes
    with a chain, a doubtful one drafts nothing (a failed look, counted as such)."""
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.1))
    policy.reset()
    assert policy.choose() == 1 and policy.opening_probe  # the estimate says plain: an opening probe
    k_cap, stop = policy.confident_draft(1, 8)
    assert k_cap == 8 and stop(0, 0.99) == GO_ON and stop(1, 0.99) == GO_ON  # confident: a chain
    k_cap, stop = policy.confident_draft(1, 8)
    assert stop(0, 0.1) == END  # doubtful: nothing drafted
    policy.observe(0, 0)
    assert policy.plain_run == 0 and policy.trials[0] > 0  # a failed look, not a plain step
    off = AdaptivePolicy(CPU, PolicyConfig(k_max=8, prior=0.1, confidence=False))
    off.reset()
    assert off.choose() == 1 and off.confident_draft(1, 8) == (1, None)  # without the rule: probe_k tokens


def _plain_steps(policy, confidence, n):
    """n plain steps whose token the target chose with top probability `confidence`."""
    for _ in range(n):
        policy.observe_target((confidence,), 0, 0)
        policy.observe(0, 0)


def test_the_target_s_confidence_calibrates_from_drafted_steps():
    """Looked-at rows calibrate target_rate per bin of the target's top probability: a row whose token
    passed is a hit, the first failed row a miss; rows past it were not reached. The prior is the
    bin's confidence."""
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=4))
    assert policy.target_rate(0.99) == pytest.approx(0.99) and policy.target_rate(0.55) == pytest.approx(0.55)
    for _ in range(200):
        policy.observe_target((0.99, 0.55, 0.99, 0.99, 0.3), 4, 1)  # row 0 passed, row 1 failed
        policy.observe(4, 1)
    assert policy.target_rate(0.99) > 0.97 and policy.target_rate(0.55) < 0.05
    assert policy.target_rate(0.3) == pytest.approx(0.3)  # never reached: the prior


def test_a_plain_request_the_target_is_sure_of_starts_drafting_mid_answer():
    """A lockout: a carried prior under which nothing pays, and the learning allowance
    backed off, so a code prompt ran plain from end to end. The target's confidence on its own
    plain tokens (calibrated: sure rows pass) lifts this request's estimate until the draft
    prefill pays (start_now); on unsure text it stays plain. Without the signal it never starts."""
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, prefill_cost=0.03, prefill_fixed=1.0)
    for signal, confidence, starts in ((True, 0.99, True), (True, 0.5, False), (False, 0.99, False)):
        policy = AdaptivePolicy(costs, PolicyConfig(k_max=8, prior=0.3, target_signal=signal))
        for _ in range(100):  # calibration from earlier drafted steps: sure rows pass, unsure ones fail
            policy.observe_target((0.99, 0.99, 0.5), 2, 2)
            policy.observe(2, 2)
            policy.observe_target((0.5,), 1, 0)
            policy.observe(1, 0)
        policy.prior = 0.3
        policy.reset()
        policy.learn_skip = 4  # backed off
        assert not policy.start_now(100, 0, 128)
        started = None
        for g in range(1, 100):
            _plain_steps(policy, confidence, 1)
            if policy.start_now(100 + g, g, 128):
                started = g
                break
        assert (started is not None) == starts, (signal, confidence, started)
        if starts:
            assert started <= 16 and policy.pooled > 0.75
    # a request that ran plain on sure text moves the next request's prior (not only drafted ones)
    before = policy.prior
    _plain_steps(policy, 0.99, 30)
    policy.reset()
    assert policy.prior == before  # (target_signal off: the last loop's policy learns nothing from them)
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=8, prior=0.3))
    _plain_steps(policy, 0.99, 30)
    policy.reset()
    assert policy.prior > 0.6


def test_predicted_acceptance_fades_once_drafted_steps_show_the_real_one():
    """The plain steps' predictions are a stand-in: drafted steps' outcomes replace them."""
    policy = AdaptivePolicy(CPU, PolicyConfig(k_max=4, prior=0.5))
    _plain_steps(policy, 0.99, 40)  # predicted 0.99 per token (the prior of the bin)
    assert policy.pooled > 0.85
    for _ in range(30):
        policy.observe_target((0.99, 0.99), 1, 0)  # the target was sure, the draft wrong
        policy.observe(1, 0)
    assert policy.pooled < 0.2 and policy.shadow_trials < 0.2  # from about 17


def test_one_stalled_step_does_not_move_the_calibration_but_a_lasting_change_does():
    """One 9-row verify took 0.98 s instead of 0.25 (the host stalled); the EMA took it
    at the clamp and rho_spec jumped from 0.84 to 1.49, which turned a math prompt drafting at tau
    3+ plain for 28 steps. The EMAs now take the median of the last 3 measurements."""
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, step_seconds=0.1)
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=8))
    curve = 0.1 * costs.v(9)
    for _ in range(5):
        policy.observe_time(8, 0.1 * 8 * costs.draft_cost, curve)
    assert policy.rho_spec == pytest.approx(1.0)
    policy.observe_time(8, 0.1 * 8 * costs.draft_cost, 4 * curve)  # one stall
    assert policy.rho_spec == pytest.approx(1.0)
    policy.observe_time(8, 0.1 * 8 * 10 * costs.draft_cost, curve)  # one stalled draft
    assert policy.draft_cost == pytest.approx(costs.draft_cost)
    for _ in range(2):  # a lasting change: twice as dear from now on
        policy.observe_time(8, 0.1 * 8 * costs.draft_cost, 2 * curve)
    assert policy.rho_spec > 1.2


def test_a_slow_spell_of_the_host_while_plain_does_not_make_drafting_look_cheap():
    """Another process slowed plain steps to 3.9x their predicted time; rho_v rose, the
    drafting prices did not, and a draft model that lost was started. Every step slows alike, so the
    choice must not change: the drafting prices move with rho_v."""
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, step_seconds=0.1)
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=4, probe_first=False, target_signal=False))
    policy.assume([0.3] * 4)  # plain wins at these prices
    assert policy._best_k(policy.beta, 4)[0] == 0
    for _ in range(12):  # plain steps at 3.9x the curve's time
        policy.observe(0, 0)
        policy.observe_time(0, None, 3.9 * 0.1)
    assert policy.rho_v == pytest.approx(3.9, rel=0.05)
    assert policy.rho_spec == pytest.approx(3.9, rel=0.05)
    assert policy.draft_cost == pytest.approx(3.9 * costs.draft_cost, rel=0.05)
    assert policy._best_k(policy.beta, 4)[0] == 0  # still plain: a 3.9x host slows drafting as much
    # the same drafter at an acceptance where drafting pays still drafts after the spell: the prices
    # moved together, so the choice is what it was on the fast host
    fast = AdaptivePolicy(costs, PolicyConfig(k_max=4))
    assert policy._best_k([0.8] * 4, 4)[0] == fast._best_k([0.8] * 4, 4)[0] > 0
    # the spell ends: plain steps at the curve's time bring every price back
    for _ in range(20):
        policy.observe(0, 0)
        policy.observe_time(0, None, 0.1)
    assert policy.rho_v == pytest.approx(1.0, rel=0.01)
    assert policy.rho_spec == pytest.approx(1.0, rel=0.01)
    assert policy.draft_cost == pytest.approx(costs.draft_cost, rel=0.01)


def test_a_requests_first_drafting_step_does_not_price_draft_tokens():
    """A head's first drafting step of a request also runs it over the whole prompt (its catch-up),
    which can take many draft tokens' time: measured as the price of a draft token, that locked
    drafting out for good (no probe runs while even a 0.9 drafter is predicted to lose). Later
    drafting steps of the request calibrate c_eff."""
    costs = CostModel(CPU.verify_cost, CPU.draft_cost, step_seconds=0.1)
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=4))
    for _ in range(5):  # five requests, each with a long catch-up at its first drafting step
        policy.reset()
        before = policy.draft_cost
        policy.observe(Outcome(1, 1, draft_seconds=3.0, verify_seconds=0.1 * costs.v(2)))
        assert policy.draft_cost == before
        policy.observe(Outcome(1, 1, draft_seconds=2 * 0.1 * costs.draft_cost, verify_seconds=0.1 * costs.v(2)))
    assert policy.draft_cost > 1.2 * costs.draft_cost  # the later steps' price (2x the curve's) moved it
    assert policy.draft_cost < 2.5 * costs.draft_cost
    assert policy._best_k([0.9] * 4, 4)[0] > 0


def test_round_width_prices_a_waiting_lookups_rows_apart_from_the_pooled_drafts():
    """A round of one draft model row and three waiting lookup rows: the lookups' drafts are free and do not
    join the draft's pool, so each position the draft model drafts costs its c d(1). One group at the mean
    c (c / 4, over a pool of 4) priced the draft's 4 forwards at a sixth of their cost and drafted 4 a row."""
    model = CostModel({1: 1.0, 4: 1.0, 8: 1.1, 16: 1.3, 32: 2.6}, 0.6, draft_rows={1: 1.0, 4: 1.2})
    draft = AdaptivePolicy(model, PolicyConfig(k_max=4))
    draft.assume([0.9] * 4)
    lookup = AdaptivePolicy.lookup_while_waiting(model, 4)
    lookup.assume([0.6] * 4)
    assert round_width([(draft, 4)] + [(lookup, 4)] * 3) == 1  # 4 forwards of 0.6 cost more than they win
    one_group = CostModel(model.verify_cost, 0.15, draft_rows=model.draft_rows)
    pooled = [AdaptivePolicy(one_group, PolicyConfig(k_max=4)) for _ in range(4)]
    for p, b in zip(pooled, (0.9, 0.6, 0.6, 0.6)):
        p.assume([b] * 4)
    assert round_width([(p, 4) for p in pooled]) == 5
    assert round_width([(draft, 4), (draft, 4)]) == 5  # two sure draft rows pool and pay
