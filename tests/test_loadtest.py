"""specdec loadtest end to end on a tiny model: real `specdec serve` subprocesses, every mode."""

import json

from specdec.bench.loadtest import percentile, summarize_level, Result
from specdec.cli import main
from tests.test_cli import cli_error


def test_percentile_and_level_summary():
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0 and percentile([], 0.5) is None
    rs = [Result("on", 2, "a", 200, 2.0, 0.5, 4, 3, 1, 4, 2, 1.33),
          Result("on", 2, "b", 200, 1.0, 0.25, 4, 3, 0, 6, 3, 1.33),
          Result("on", 2, "c", 429, 0.01, None, 0, 0, 0, 0, 0),
          Result("on", 2, "d", 500, 0.01, None, 0, 0, 0, 0, 0, 0.0, "boom")]
    s = summarize_level(rs, 2.0)
    assert (s["ok"], s["rejected_429"], s["failed"]) == (2, 1, 1)
    assert s["throughput_tokens_per_second"] == 4.0
    assert s["speculation_on_fraction"] == round(5 / 6, 3)
    assert s["tpot_mean"] == round(((2.0 - 0.5) / 3 + (1.0 - 0.25) / 3) / 2, 3)


def test_loadtest_every_mode_on_a_tiny_model(tiny_llama_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": str(i), "category": c, "prompt": f"w{i} w2 w3 w{i} w2"}) + "\n"
                            for i, c in enumerate(["qa", "rag", "qa", "rag"])))
    out = tmp_path / "lt"
    assert main(["loadtest", "--model", str(tiny_llama_dir), "--draft", str(tiny_llama_dir), "--concurrency", "1,3",
                 "--max-tokens", "6", "--completions", "--max-batch", "2", "--max-context", "128", "--min-requests", "2",
                 "--dataset", str(data), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["modes"]) == {"off", "on", "policy"}
    for mode, levels in summary["modes"].items():
        for c, s in levels.items():
            assert s["failed"] == 0 and s["ok"] + s["rejected_429"] == s["requests"], (mode, c, s)
    assert summary["modes"]["off"]["1"]["speculation_on_fraction"] == 0.0
    assert summary["modes"]["on"]["1"]["speculation_on_fraction"] > 0.5
    assert (out / "summary.md").read_text().count("|") > 20


def test_loadtest_bad_values(capsys):
    assert "concurrency" in cli_error(["loadtest", "--concurrency", "0,2"], capsys)
    assert "mode" in cli_error(["loadtest", "--modes", "fast"], capsys)


def test_per_replica_counts_from_the_fronts_snapshots():
    from specdec.bench.loadtest import markdown, replica_deltas
    before = {"front": {"sent": 3, "answered": 3, "failed": 0, "retried": 0},
              "replicas": {"a": {"answered": 2}, "b": {"answered": 1}}}
    after = {"front": {"sent": 9, "answered": 8, "failed": 1, "retried": 1},
             "replicas": {"a": {"answered": 5}, "b": {"answered": 3}, "c": {"answered": 0}}}
    d = replica_deltas(before, after)
    assert d == {"per_replica": {"a": 3, "b": 2}, "retried": 1, "front_failed": 1}
    assert replica_deltas(None, after) == {}
    row = {"requests": 6, "ok": 5, "rejected_429": 0, "failed": 1, "throughput_tokens_per_second": 1.0,
           "latency_p50": 1, "latency_p95": 2, "ttft_p50": 0.1, "tpot_mean": 0.05, "speculation_on_fraction": 1.0,
           "tau": 1.5} | d
    assert markdown({"modes": {"on": {"4": row}}}).splitlines()[-1].endswith("| 3 2 |")
