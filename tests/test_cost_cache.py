"""The policy's measured costs kept per host, model pair and kernel build ($SPECDEC_HOME/costs)."""

import pytest

from specdec.policy import CostModel
from specdec.policy import measure
from tests.conftest import tiny_model


@pytest.fixture
def fake_measure(monkeypatch, tmp_path):
    """_measure and the start-up check's timer replaced by fixed numbers; the calls to _measure counted."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    state = {"calls": 0, "spread": 1.0, "now": 0.010, "c": 0.25}

    def fake(target, draft, sizes, context=256, repeats=3):
        state["calls"] += 1
        return CostModel({1: 1.0, 2: 1.1, 3: 1.2}, state["c"] if draft is not None else 0.0, 0.010, 0.01, 0.3), \
            state["spread"]

    monkeypatch.setattr(measure, "_measure", fake)
    monkeypatch.setattr(measure, "timed", lambda fn, device, repeats: [state["now"]] * repeats)
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


def test_a_cached_step_far_slower_than_the_live_one_is_measured_again(fake_measure, tiny_target, tiny_draft):
    measure.cached_costs(tiny_target, tiny_draft)
    fake_measure["now"] = 0.010 / 1.4  # within RECHECK: still the cache
    measure.cached_costs(tiny_target, tiny_draft)
    assert fake_measure["calls"] == 1
    fake_measure["now"] = 0.010 / 2.0  # the entry was measured on a busy host
    measure.cached_costs(tiny_target, tiny_draft)
    assert fake_measure["calls"] == 2


def test_a_live_step_slower_than_the_cached_one_keeps_the_entry(fake_measure, tiny_target, tiny_draft):
    """A busy host at start: the calibration scales the cached ratios; measuring now costs seconds and
    would not be kept."""
    measure.cached_costs(tiny_target, tiny_draft)
    fake_measure.update(now=0.010 * 3.0, c=0.9)
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
    before = path.read_text()
    fake_measure.update(now=0.004, spread=3.0, c=0.9)  # the entry looks slow, and the measurement is noisy
    assert measure.cached_costs(tiny_target, tiny_draft).draft_cost == 0.25
    assert fake_measure["calls"] == 2 and path.read_text() == before
    fake_measure.update(spread=1.0)  # a quiet re-measurement replaces the entry
    assert measure.cached_costs(tiny_target, tiny_draft).draft_cost == 0.9


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
