import json

import pytest

from specdec.bench.compare import Record, first_difference, summarize
from specdec.bench.datasets import load_prompts, read_jsonl
from specdec.bench.profile import VERIFY_SIZES, profile
from specdec.cli import main
from specdec.errors import SpecdecError


def test_shipped_code_prompts_load():
    prompts = load_prompts()
    assert len(prompts) == 10 and all(p.category == "code" and p.turns[0] for p in prompts)


def test_jsonl_prompt_or_turns_and_malformed_lines_are_counted(capsys):
    lines = [json.dumps({"prompt": "a"}), "{not json", json.dumps({"turns": ["b", "c"], "category": "mt"}),
             json.dumps({"other": 1}), ""]
    prompts = read_jsonl(lines, "x.jsonl")
    assert [p.turns for p in prompts] == [("a",), ("b", "c")]
    assert "skipped 2 malformed" in capsys.readouterr().err


def test_missing_or_empty_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(SpecdecError, match="not found"):
        load_prompts(str(tmp_path / "none.jsonl"))
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    with pytest.raises(SpecdecError, match="no usable prompts"):
        load_prompts(str(tmp_path / "bad.jsonl"))


def test_unknown_method_is_refused_before_loading(capsys):
    assert main(["bench", "--methods", "plain,telepathy"]) == 2
    assert "telepathy" in capsys.readouterr().err


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_summary_reports_speedup_acceptance_and_mismatches():
    stats = {"steps": 2, "drafted": 4, "accepted": 3, "drafted_at": [2, 2], "accepted_at": [2, 1],
             "tau": 2.5, "alpha": 0.75, "draft_seconds": 0.1, "verify_seconds": 0.5, "prefill_seconds": 0.1}
    plain = dict(steps=5, drafted=0, accepted=0, drafted_at=[], accepted_at=[], tau=1.0, alpha=0.0,
                 draft_seconds=0.0, verify_seconds=1.0, prefill_seconds=0.1)
    recs = [Record("p1", "code", "plain", [1, 2, 3, 4, 5], 2.0, [plain]),
            Record("p1", "code", "draft", [1, 2, 3, 4, 5], 1.0, [stats]),
            Record("p1", "code", "hf", [1, 2, 9, 4, 5], 4.0, None)]
    s = summarize(recs)
    assert s["draft"]["speedup_vs_plain_mean"] == 2.0 and s["hf"]["speedup_vs_plain_mean"] == 0.5
    assert s["draft"]["tau"] == 2.5 and s["draft"]["alpha"] == 0.75
    assert s["draft"]["per_position_acceptance"] == [1.0, 0.5]
    assert s["hf"]["greedy_mismatches"] == [{"prompt_id": "p1", "position": 2}]


def test_profile_reports_the_verify_curve(tiny_target, tiny_draft):
    r = profile(tiny_target, tiny_draft, context=32, repeats=2, bandwidth_mb=16)
    assert set(r["verify_cost"]) == {str(n) for n in VERIFY_SIZES} and r["verify_cost"]["1"] == 1.0
    for key in ("bandwidth_gbs", "plain_tokens_per_second", "roofline_tokens_per_second", "roofline_fraction",
                "draft_cost_ratio"):
        assert r[key] > 0


def test_select_prompts_by_category_and_limit():
    from specdec.bench.compare import select_prompts
    from specdec.bench.datasets import Prompt
    prompts = [Prompt(str(i), c, ("x",)) for i, c in enumerate(["a", "b", "a", "b", "a"])]
    assert [p.id for p in select_prompts(prompts, None, 2)] == ["0", "1", "2", "3"]
    assert [p.id for p in select_prompts(prompts, "a", None)] == ["0", "2", "4"]
    with pytest.raises(SpecdecError, match="no prompts"):
        select_prompts(prompts, "zzz", None)


def test_bench_end_to_end_multi_turn_and_resume(tiny_llama_dir, tmp_path):
    """Tiny model, a 2-turn prompt and a 1-turn prompt; a second run resumes and runs nothing new."""
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "m", "category": "mt", "turns": ["w1 w2 w3 w1 w2", "w4 w1 w2"]}) + "\n"
                    + json.dumps({"id": "s", "category": "qa", "prompt": "w5 w6 w5 w6"}) + "\n")
    argv = ["bench", "--model", str(tiny_llama_dir), "--methods", "plain,ngram,hf", "--dataset", str(data),
            "--max-new-tokens", "12", "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 6
    multi = [r for r in records if r["prompt_id"] == "m" and r["method"] == "plain"][0]
    assert len(multi["stats"]) == 2  # one stats entry per turn
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["categories"]) == {"mt", "qa"}
    assert summary["methods"]["ngram"]["greedy_mismatches"] == []
    assert main(argv) == 0  # resume: nothing left to run
    assert len((tmp_path / "run" / "records.jsonl").read_text().splitlines()) == 6


def test_negative_draft_vocab_is_refused(tiny_llama_dir, tmp_path, capsys):
    argv = ["bench", "--model", str(tiny_llama_dir), "--methods", "plain", "--draft-vocab", "-5",
            "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    assert "draft_vocab" in capsys.readouterr().err
