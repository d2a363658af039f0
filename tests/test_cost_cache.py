"""The policy's measured costs kept per host, model pair and kernel build ($SPECDEC_HOME/costs)."""

import pytest

from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig
from specdec.policy import measure
from tests.conftest import tiny_model


@pytest.fixture
def fake_measure(monkeypatch, tmp_path):
    """_measure replaced by fixed numbers; the calls to _measure counted."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    state = {"calls": 0, "spread": 1.0, "c": 0.25}

    def fake(target, draft, sizes, context=256, repeats=3, batches=()):
        state["calls"] += 1
        rows = {1: 1.0, **{n: 1.0 + 0.1 * n for n in batches}}
        return CostModel({1: 1.0, 2: 1.1, 3: 1.2}, state["c"] if draft is not None else 0.0, 0.010, 0.01, 0.3,
                         draft_rows=rows), state["spread"]

    monkeypatch.setattr(measure, "_measure", fake)
    return state


def test_costs_are_measured_once_then_read(fake_measure, tiny_target, tiny_draft, tmp_path):
    first = measure.cached_costs(tiny_target, tiny_draft, sizes=(1, 2, 3))
    second = measure.cached_costs(tiny_target, tiny_draft, sizes=(1, 2, 3))
    assert fake_measure["calls"] == 1
    assert second == first and second.verify_cost == {1: 1.0, 2: 1.1, 3: 1.2} and second.draft_cost == 0.25
    assert len(list((tmp_path / "costs").glob("*.json"))) == 1


def test_another_pair_or_other_sizes_are_measured_anew(fake_measure, tiny_target, tiny_draft):
    measure.cached_costs(tiny_target, tiny_draft, sizes=(1, 2, 3))
    measure.cached_costs(tiny_target, None, sizes=(1, 2, 3))
    measure.cached_costs(tiny_target, tiny_draft, sizes=(1, 2, 3, 5))
    measure.cached_costs(tiny_target, tiny_model(7, num_layers=1), sizes=(1, 2, 3))  # other weights
    assert fake_measure["calls"] == 4


def test_a_pooled_drafts_row_costs_are_kept_apart_and_read_back(fake_measure, tiny_target, tiny_draft):
    """A server's costs (the pooled draft's d(n) at its row counts) are their own entry; generate's stays."""
    single = measure.cached_costs(tiny_target, tiny_draft, sizes=(1, 2, 3))
    pooled = measure.cached_costs(tiny_target, tiny_draft, sizes=(1, 2, 3), batches=(2, 4))
    again = measure.cached_costs(tiny_target, tiny_draft, sizes=(1, 2, 3), batches=(2, 4))
    assert fake_measure["calls"] == 2 and single.draft_rows == {1: 1.0}
    assert again.source and again.draft_rows == pooled.draft_rows == {1: 1.0, 2: 1.2, 4: 1.4}
    import json
    from pathlib import Path
    for bad in (["1", "2"], {"1": 3.0}):  # a damaged entry: measured again, not a crash
        path = Path(again.source)
        path.write_text(json.dumps({**json.loads(path.read_text()), "draft_rows": bad}))
        calls = fake_measure["calls"]
        assert measure.cached_costs(tiny_target, tiny_draft, sizes=(1, 2, 3), batches=(2, 4)).draft_rows[4] == 1.4
        assert fake_measure["calls"] == calls + 1


def test_a_cached_entry_is_read_without_timing_a_step(fake_measure, tiny_target, tiny_draft, monkeypatch):
    """No forward runs at start for a cached entry (the first token waits for none)."""
    measure.cached_costs(tiny_target, tiny_draft)
    monkeypatch.setattr(measure, "timed", lambda *a, **k: pytest.fail("a step was timed at start"))
    costs = measure.cached_costs(tiny_target, tiny_draft)
    assert fake_measure["calls"] == 1 and costs.source and costs.draft_cost == 0.25


def plain_steps(costs, *seconds):
    """A policy on `costs` that sees plain steps of these seconds (the engine's observe_time)."""
    policy = AdaptivePolicy(costs, PolicyConfig(k_max=4))
    for s in seconds:
        policy.observe_time(0, None, s)
    return policy


def test_live_plain_steps_far_faster_than_the_cached_ones_mark_it_stale(fake_measure, tiny_target, tiny_draft):
    """The entry was measured on a busy host: this run keeps its costs (the calibration scales them),
    and the next start measures afresh."""
    measure.cached_costs(tiny_target, tiny_draft)
    plain_steps(measure.cached_costs(tiny_target, tiny_draft), *[0.010 / 1.4] * 4)  # within RECHECK
    assert measure.cached_costs(tiny_target, tiny_draft) and fake_measure["calls"] == 1
    costs = measure.cached_costs(tiny_target, tiny_draft)
    policy = plain_steps(costs, 0.010 / 2.0)  # one fast step alone is not enough
    assert measure.cached_costs(tiny_target, tiny_draft) and fake_measure["calls"] == 1
    policy.observe_time(0, None, 0.010 / 2.0)
    assert policy.costs is costs and costs.draft_cost == 0.25 and costs.source is None
    fake_measure["c"] = 0.3
    assert measure.cached_costs(tiny_target, tiny_draft).draft_cost == 0.3 and fake_measure["calls"] == 2
    assert measure.cached_costs(tiny_target, tiny_draft).draft_cost == 0.3 and fake_measure["calls"] == 2


def test_live_steps_slower_than_the_cached_ones_keep_the_entry(fake_measure, tiny_target, tiny_draft):
    """A busy host now: the calibration scales the cached ratios; measuring now costs seconds and
    would not be kept."""
    measure.cached_costs(tiny_target, tiny_draft)
    plain_steps(measure.cached_costs(tiny_target, tiny_draft), *[0.010 * 3.0] * 4)
    fake_measure["c"] = 0.9
    assert measure.cached_costs(tiny_target, tiny_draft).draft_cost == 0.25
    assert fake_measure["calls"] == 1


def test_a_measurement_on_a_busy_host_is_used_but_not_kept(fake_measure, tiny_target, tiny_draft, tmp_path):
    fake_measure["spread"] = 2.5
    costs = measure.cached_costs(tiny_target, tiny_draft)
    assert costs.draft_cost == 0.25
    assert not list((tmp_path / "costs").glob("*.json"))
    measure.cached_costs(tiny_target, tiny_draft)
    assert fake_measure["calls"] == 2


def test_a_busy_measurement_keeps_the_cached_entry(fake_measure, tiny_target, tiny_draft, tmp_path):
    measure.cached_costs(tiny_target, tiny_draft)
    (path,) = (tmp_path / "costs").glob("*.json")
    plain_steps(measure.cached_costs(tiny_target, tiny_draft), *[0.004] * 3)  # the entry looks slow: stale
    stale = path.read_text()
    fake_measure.update(spread=3.0, c=0.9)  # and the measurement at the next start is noisy
    assert measure.cached_costs(tiny_target, tiny_draft).draft_cost == 0.25
    assert fake_measure["calls"] == 2 and path.read_text() == stale
    fake_measure.update(spread=1.0)  # a quiet re-measurement replaces the entry
    assert measure.cached_costs(tiny_target, tiny_draft).draft_cost == 0.9
    assert fake_measure["calls"] == 3 and measure.cached_costs(tiny_target, tiny_draft).draft_cost == 0.9


def test_a_broken_cache_file_is_measured_again(fake_measure, tiny_target, tiny_draft, tmp_path):
    measure.cached_costs(tiny_target, tiny_draft)
    (path,) = (tmp_path / "costs").glob("*.json")
    path.write_text("{not json")
    assert measure.cached_costs(tiny_target, tiny_draft).draft_cost == 0.25
    assert fake_measure["calls"] == 2


def test_measured_ratios_come_from_neighbouring_plain_steps(tiny_target, tiny_draft):
    costs, spread = measure._measure(tiny_target, tiny_draft, (1, 2, 3, 5), context=16, repeats=1)
    assert costs.verify_cost[1] == 1.0 and spread >= 1.0 and costs.step_seconds > 0
    curve = [costs.verify_cost[n] for n in (1, 2, 3, 5)]
    assert curve == sorted(curve)  # more positions never priced cheaper
    assert costs.draft_cost > 0


def test_one_stray_plain_step_is_not_a_busy_host():
    assert measure.spread([1.0, 1.0, 1.1, 1.0, 5.0, 1.0, 0.2]) == pytest.approx(1.1)
    assert measure.spread([1.0, 2.0, 1.0, 2.0, 1.0, 2.0]) == 2.0
    assert measure.spread([1.0, 3.0]) == 3.0


def test_a_device_drafting_models_c_is_timed_on_its_chain(tiny_draft):
    """Where a draft model drafts on the device (one CUDA graph a chain), its c is a chain's time a token:
    one fed token and a k-token chain, here run eagerly; the cache is left where it was."""
    cache = tiny_draft.new_cache(64)
    cache.advance(40)
    seconds = measure.chain_token_seconds(tiny_draft, cache, 40, 4, 3)
    assert seconds > 0 and cache.length == 40
    assert measure.step_mode(tiny_draft) == ""  # a CPU model's cache key is what it was
