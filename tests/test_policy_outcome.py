"""The policy's face: observe(Outcome) learns exactly what the separate calls it stands for learn,
and the discounted Beta counter behind every estimate."""

import pytest

from specdec.policy import AdaptivePolicy, Beta, CostModel, Outcome, PolicyConfig

COSTS = CostModel({1: 1.0, 2: 1.05, 5: 1.3, 17: 2.0}, draft_cost=0.1, step_seconds=0.05)


def state(p: AdaptivePolicy) -> tuple:
    return (p.beta, p.pooled, p.rho_v, p.rho_spec, p.draft_cost, p.plain_run, p.interval, p.shadow_trials,
            p.target_rate(0.95), dict(p.tree_cost), [p.tree_beta(n) for n in p.cfg.tree_sizes])


def test_observe_outcome_is_the_separate_calls():
    cfg = PolicyConfig(k_max=6, tree_sizes=(4, 8), tree_depth=3)
    one, many = AdaptivePolicy(COSTS, cfg), AdaptivePolicy(COSTS, cfg)
    steps = [Outcome(3, 2, confidence=[0.9, 0.8, 0.3, 0.99], draft_seconds=0.01, verify_seconds=0.06),
             Outcome(0, 0, confidence=[0.97], verify_seconds=0.05),
             Outcome(2, 1, nodes=8, draft_seconds=0.02, verify_seconds=0.09, forwards=3),
             Outcome(4, 4, batch=2, width=5, draft_seconds=0.02, verify_seconds=0.07),
             Outcome(3, 3, batch=3, width=4, draft_seconds=0.01, verify_seconds=0.07, pooled=2),
             Outcome(1, 0)]
    for o in steps:
        one.choose_action()
        many.choose_action()
        one.observe(o)
        if o.nodes is not None:
            many.observe_tree(o.nodes, o.num_drafted, o.num_accepted)
        else:
            if o.confidence:
                many.observe_target(o.confidence, o.num_drafted, o.num_accepted)
            many.observe(o.num_drafted, o.num_accepted)
        if o.verify_seconds is not None:
            forwards = o.num_drafted if o.forwards is None else o.forwards
            many.observe_time(forwards, o.draft_seconds, o.verify_seconds, o.batch, o.width, o.nodes, o.pooled)
        assert state(one) == state(many)


def test_beta_counts_fade_and_mean():
    b = Beta()
    assert b.mean(0.6, 2.0) == pytest.approx(0.6) and b.rate() == 0.0
    b.add(1.0)
    b.add(0.0, keep=0.5)
    assert (b.hits, b.trials) == (0.5, 1.5) and b.rate() == pytest.approx(1 / 3)
    b.fade(0.5)
    assert (b.hits, b.trials) == (0.25, 0.75)
    assert b.mean(1.0, 1.0) == pytest.approx(1.25 / 1.75)
