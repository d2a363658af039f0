"""The structured-output bench (scripts/structured_bench.py) on the small CI model, so that it cannot rot:
every method it compares runs, every answer that stopped validates, and speculative tokens equal
constrained plain decoding's. And the depth-pruning script refuses a bad layer count before loading."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_structured_bench_runs_and_checks_its_answers(smollm2_path):
    cmd = [sys.executable, str(ROOT / "scripts/structured_bench.py"), "--model", str(smollm2_path),
           "--draft", str(smollm2_path), "--limit", "3", "--max-new-tokens", "48",
           "--methods", "plain,defaults,no-forced"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, timeout=600)
    report = json.loads(out.stdout)
    assert report["tasks"] == 3 and len(report["records"]) == 9
    summary = report["summary"]
    for m in ("plain", "defaults", "no-forced"):
        stopped, total = (int(x) for x in summary[m]["valid_of_stopped"].split("/"))
        assert stopped == total and total + summary[m]["cut_by_length"] == 3, summary[m]
    assert summary["defaults"]["greedy_mismatches"] == 0 and summary["no-forced"]["greedy_mismatches"] == 0
    steps = {m: sum(r["steps"] for r in report["records"] if r["method"] == m) for m in summary}
    assert steps["defaults"] < steps["plain"]  # drafts (forced tokens at least) were accepted


def test_draft_depth_prune_refuses_a_negative_layer_count():
    out = subprocess.run([sys.executable, str(ROOT / "scripts/draft_depth_prune.py"), "-1"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "N must be >= 0" in out.stderr
