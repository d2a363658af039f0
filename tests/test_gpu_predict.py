"""scripts/gpu_predict.py: its arithmetic on hand-built counts, and clear errors for bad inputs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_predict  # noqa: E402

V = {1: 1.0, 2: 1.2, 3: 1.4, 5: 1.8}  # v(n)


def test_a_full_length_chain_is_the_chain_formula():
    # every step drafts 2 tokens; the first is accepted in 8 of 10 steps, both in 5
    m = {"steps": 10, "drafted_at": [10, 10], "accepted_at": [8, 5]}
    assert gpu_predict.capped(m, 2, 0.25, V) == pytest.approx((1 + 0.8 + 0.5) / (1.4 + 2 * 0.25))
    assert gpu_predict.capped(m, 1, 0.25, V) == pytest.approx((1 + 0.8) / (1.2 + 0.25))
    assert gpu_predict.capped(m, 0, 0.25, V) == 1.0
    best = gpu_predict.chain_prediction(m, 0.25, V)
    assert best["best_k"] == 1 and best["at_best_k"] > best["at_k"]  # 1.8 / 1.45 against 2.3 / 1.9


def test_a_lookup_pays_only_for_the_drafts_it_makes():
    # 10 steps: 6 draft nothing, 4 draft 2 tokens (all accepted): 4 steps of cost v(3) + 2c, 6 of v(1)
    m = {"steps": 10, "drafted_at": [4, 4], "accepted_at": [4, 4]}
    expected = (1 + 0.8) / (0.6 * 1.0 + 0.4 * (1.4 + 2 * 0.1))
    assert gpu_predict.capped(m, 2, 0.1, V) == pytest.approx(expected)
    assert gpu_predict.chain_prediction(m, 10.0, V)["best_k"] == 0  # a dear draft: plain decoding pays best


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts/gpu_predict.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)


def test_bad_inputs_get_a_clear_error(tmp_path):
    missing = run("--gpu", str(tmp_path / "none.json"), "--acceptance", str(tmp_path))
    assert missing.returncode != 0 and "cannot read the GPU profile" in missing.stderr
    (tmp_path / "p.json").write_text(json.dumps({"device": "cuda"}))
    not_profile = run("--gpu", str(tmp_path / "p.json"), "--acceptance", str(tmp_path))
    assert not_profile.returncode != 0 and "is not a profile" in not_profile.stderr
    (tmp_path / "p.json").write_text(json.dumps({"verify_cost": {"1": 1.0}, "step_seconds": 0.004}))
    no_run = run("--gpu", str(tmp_path / "p.json"), "--acceptance", str(tmp_path / "run"))
    assert no_run.returncode != 0 and "cannot read the bench summary" in no_run.stderr
    assert "Traceback" not in missing.stderr + not_profile.stderr + no_run.stderr


def test_chains_are_priced_at_the_device_chains_c_and_trees_at_a_steps(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"modes": {"graphs": {
        "verify_cost": {"1": 1.0, "5": 1.2}, "step_seconds": 0.004, "draft_cost_ratio": 0.7,
        "chain_cost_ratio_device": 0.4, "head_cost_ratio": 0.2, "head_chain_cost_ratio_device": 0.1}}}))
    gpu = gpu_predict.gpu_costs(path, "graphs")
    m = {"drafted": 0}
    assert gpu_predict.draft_token_cost("draft", m, gpu) == 0.4 and gpu_predict.draft_token_cost("tree", m, gpu) == 0.7
    assert gpu_predict.draft_token_cost("eagle", m, gpu) == 0.1
    assert gpu_predict.draft_token_cost("eagle-tree", m, gpu) == 0.2
    tree = {"tokens": 30, "steps": 10, "nodes": 40}  # 3 tokens a step from 4 nodes (v(5) = 1.2)
    assert gpu_predict.tree_prediction(tree, 0.2, gpu["v"], 4)["at_k"] == pytest.approx(3 / (1.2 + 4 * 0.2), abs=1e-3)
    assert gpu_predict.tree_prediction(tree, 0.2, gpu["v"], 4, 0.5)["at_k"] == pytest.approx(3 / 1.7, abs=1e-3)
    path.write_text(json.dumps({"verify_cost": {"1": 1.0}, "step_seconds": 0.004, "draft_cost_ratio": 0.7}))
    assert gpu_predict.draft_token_cost("draft", m, gpu_predict.gpu_costs(path, "graphs")) == 0.7  # no device chain
