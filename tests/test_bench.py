import json

import pytest

from specdec.bench.compare import MethodSpec, Record, parse_k_list, parse_methods, read_records
from specdec.drafters.registry import Parts
from specdec.bench.report import first_difference, predicted_speedup, summarize, theory
from specdec.bench.datasets import load_prompts, read_jsonl
from specdec.bench.profile import VERIFY_SIZES, profile
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.policy.costs import CostModel
from tests.test_cli import cli_error


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
    stats = {"new_tokens": 5, "steps": 2, "drafted": 4, "accepted": 3, "rejections": 1, "drafted_at": [2, 2],
             "accepted_at": [2, 1], "draft_seconds": 0.1, "verify_seconds": 0.5, "prefill_seconds": 0.1,
             "seconds": 1.0}
    plain = dict(new_tokens=5, steps=5, drafted=0, accepted=0, rejections=0, drafted_at=[], accepted_at=[],
                 draft_seconds=0.0, verify_seconds=1.0, prefill_seconds=0.1, seconds=2.0)
    recs = [Record("p1", "code", "plain", [1, 2, 3, 4, 5], 2.0, [plain]),
            Record("p1", "code", "draft", [1, 2, 3, 4, 5], 1.0, [stats]),
            Record("p1", "code", "hf", [1, 2, 9, 4, 5], 4.0, None)]
    s = summarize(recs)
    assert s["draft"]["speedup_vs_plain_mean"] == 2.0 and s["hf"]["speedup_vs_plain_mean"] == 0.5
    assert s["draft"]["tau"] == 2.5 and s["draft"]["alpha"] == 0.75
    assert s["draft"]["per_position_acceptance"] == [1.0, 0.5]
    assert s["draft"]["alpha_iid"] == 0.75  # 3 accepted, 1 rejection
    assert s["draft"]["time_split"]["other_seconds"] == 0.3
    assert s["hf"]["greedy_mismatches"] == [{"prompt_id": "p1", "repeat": 0, "position": 2}]
    assert s["draft"]["greedy_mismatches"] == []


def test_k_list_and_method_parsing():
    assert parse_k_list("4") == [4] and parse_k_list("1, 2,8") == [1, 2, 8]
    assert parse_k_list("2,auto,auto4,auto-k16") == [2, "auto", "auto4", "auto-k16"]
    assert parse_methods("draft:auto4", [4]) == [MethodSpec("draft:auto4", "draft", 4, adaptive=True)]
    assert parse_methods("draft:auto-k12", [4]) == [MethodSpec("draft:auto-k12", "draft", 12, adaptive=True,
                                                               confidence=False)]
    for bad in ("1,x", "2.5", "", "0", "-1", "auto0", "autok4", "auto-4"):
        with pytest.raises(SpecdecError, match="--k"):
            parse_k_list(bad)
    assert parse_methods("plain,draft", [4]) == [MethodSpec("plain", "plain", 1), MethodSpec("draft", "draft", 4)]
    assert [s.label for s in parse_methods("plain,ngram,hf", [1, 2])] == ["plain", "ngram:1", "ngram:2", "hf"]
    assert parse_methods("draft:8", [4]) == [MethodSpec("draft:8", "draft", 8)]
    assert parse_methods("tree:auto", [4]) == [MethodSpec("tree:auto", "tree", 8, adaptive=True)]
    assert parse_methods("draft:auto-k,hybrid", ["auto"]) == [
        MethodSpec("draft:auto-k", "draft", 8, adaptive=True, confidence=False),
        MethodSpec("hybrid:auto", "hybrid", 8, adaptive=True, confidence=True)]
    assert [s.label for s in parse_methods("draft,hf", [2, "auto", "auto-k"])] == [
        "draft:2", "draft:auto", "draft:auto-k", "hf"]
    for bad, msg in (("telepathy", "unknown method"), ("plain:3", "takes no k"), ("draft,draft", "twice"),
                     ("draft:x", "--k"), ("", "no methods"), ("hf-lookup:auto", "adaptive")):
        with pytest.raises(SpecdecError, match=msg):
            parse_methods(bad, [4])


def test_k_list_with_a_non_integer_is_a_clear_cli_error(capsys):
    assert main(["bench", "--k", "1,two,3"]) == 2
    assert "--k" in capsys.readouterr().err


def test_predicted_speedup_formula():
    assert predicted_speedup(0.0, 4, 0.25, 1.2) == pytest.approx(1 / 2.2)
    assert predicted_speedup(1.0, 4, 0.25, 1.2) == pytest.approx(5 / 2.2)
    assert predicted_speedup(0.8, 3, 0.0, 1.0) == pytest.approx((1 - 0.8 ** 4) / 0.2)


def test_theory_takes_costs_from_the_run():
    methods = {"plain": {"kind": "plain", "k": 1, "steps": 10, "decode_tokens_per_second": 2.0,
                         "time_split": {"verify_seconds": 5.0, "draft_seconds": 0.0}},
               "draft": {"kind": "draft", "k": 4, "steps": 4, "alpha_iid": 0.8, "tau": 3.0,
                         "decode_tokens_per_second": 3.0, "speedup_vs_plain_mean": 1.4,
                         "time_split": {"verify_seconds": 2.4, "draft_seconds": 2.0}}}
    t = theory(methods)["draft"]  # t1 = 0.5 s; v = 0.6 / 0.5 = 1.2; c = 0.5 / 4 / 0.5 = 0.25
    assert t["c"] == 0.25 and t["v(5)"] == 1.2 and t["measured_decode_speedup"] == 1.5
    assert t["predicted_speedup"] == round(predicted_speedup(0.8, 4, 0.25, 1.2), 3)
    profiled = theory(methods, {"verify_cost": {1: 1.0, 3: 1.1, 9: 1.7}, "draft_cost_ratio": 0.3})["draft"]
    assert profiled["v(5)"] == pytest.approx(1.3) and profiled["c"] == 0.3


def test_records_cut_short_by_an_interrupt_are_run_again(tmp_path):
    path = tmp_path / "records.jsonl"
    good = json.dumps(Record("p", "c", "plain", [1], 1.0, None).__dict__)
    path.write_text(good + "\n" + good[:20])
    assert len(read_records(path)) == 1


def test_llama_methods_without_a_llama_cpp_build_are_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.delenv("SPECDEC_LLAMA_BIN", raising=False)
    assert main(["bench", "--methods", "plain,llama-lookup"]) == 2
    assert "scripts/llama_cpp.sh build" in capsys.readouterr().err
    assert main(["bench", "--methods", "plain,llama", "--llama-bin", str(tmp_path / "nowhere")]) == 2
    assert "--llama-bin: no executable llama-server" in capsys.readouterr().err


def test_a_llama_server_killed_by_sigill_names_the_build_to_make(tmp_path):
    """A native llama.cpp build whose instructions the CPU refuses (ggml's AMX on some KVM guests) dies at
    start: the error says so and names a build without them."""
    from specdec.bench.llama_server import LlamaServer
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho starting\nkill -ILL $$\n")
    fake.chmod(0o755)
    with pytest.raises(SpecdecError, match=r"exited with -4 \(SIGILL: .*llama_cpp\.sh build avx512.*its log") as e:
        LlamaServer(fake, tmp_path / "model.gguf", None, 64, 1, tmp_path / "llama.log")
    assert "starting" in str(e.value)


@pytest.mark.parametrize("methods, error", [("llama-spec:0", "K >= 1"), ("llama-spec:4@2", "0 <= P <= 1"),
                                            ("llama-spec:x", "llama-spec takes :K or :K@P")])
def test_llama_spec_pins_are_checked(methods, error):
    with pytest.raises(SpecdecError, match=error):
        parse_methods(methods, [2])


def test_llama_spec_pins_its_draft_length_and_p_min():
    specs = parse_methods("llama,llama-spec,llama-spec:4,llama-spec:6@0.75", [2])
    assert [(s.kind, s.k, s.p_min) for s in specs] == [("llama", 1, None), ("llama-spec", 0, None),
                                                       ("llama-spec", 4, None), ("llama-spec", 6, 0.75)]


def test_profile_reports_the_verify_curve(tiny_target, tiny_draft):
    r = profile(tiny_target, tiny_draft, context=32, repeats=2, bandwidth_mb=16)
    assert set(r["verify_cost"]) == {str(n) for n in VERIFY_SIZES} and r["verify_cost"]["1"] == 1.0
    for key in ("bandwidth_gbs", "plain_tokens_per_second", "roofline_tokens_per_second", "roofline_fraction",
                "draft_cost_ratio"):
        assert r[key] > 0
    rounds = r["roofline_rounds"]  # bandwidth and step alternate; the fraction is the median of the pairs'
    assert len(rounds) == 2 * 2 + 1
    fractions = sorted(x["fraction"] for x in rounds)
    assert r["roofline_fraction"] == pytest.approx(fractions[len(fractions) // 2], abs=1e-3)
    assert r["draft_prefill_cost"] >= 0 and r["draft_prefill_fixed"] >= 0  # the policy's affine prefill price
    assert r["draft_prefill_quadratic"] >= 0  # and attention's square (0 for a draft that holds few positions)
    assert r["draft_prefill_cost"] > 0 or r["draft_prefill_fixed"] > 0
    d = r["draft_rows"]  # a server's pooled draft position over 1, 4 and 16 rows, against one row's
    assert list(d) == ["1", "4", "16"] and d["1"] == 1.0 and 1.0 <= d["4"] <= d["16"]
    assert CostModel.from_profile(r).draft_rows == {1: 1.0, 4: d["4"], 16: d["16"]}


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
    argv = ["bench", "--model", str(tiny_llama_dir), "--methods", "plain,ngram,hf", "--k", "4", "--dataset", str(data),
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


def test_bench_k_sweep_repeats_theory_and_plots(tiny_llama_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "s", "category": "qa", "prompt": "w5 w6 w5 w6 w5 w6"}) + "\n")
    out = tmp_path / "run"
    assert main(["bench", "--model", str(tiny_llama_dir), "--methods", "plain,ngram", "--k", "1,3",
                 "--repeats", "2", "--theory", "--dataset", str(data), "--max-new-tokens", "10",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"plain", "ngram:1", "ngram:3"}
    assert summary["methods"]["ngram:3"]["k"] == 3 and summary["methods"]["plain"]["runs"] == 2
    assert len(summary["methods"]["plain"]["tokens_per_second_repeats"]["values"]) == 2
    assert all(m["greedy_mismatches"] == [] for k, m in summary["methods"].items() if k != "plain")
    assert set(summary["theory"]) == {"ngram:1", "ngram:3"}
    costs = summary["step_costs"]
    assert costs["plain"]["verified_per_step"] == 1.0 and costs["plain"]["verify_vs_plain_step"] == 1.0
    assert 1.0 <= costs["ngram:3"]["verified_per_step"] <= 4.0 and costs["plain"]["plain_fraction"] == 1.0
    assert "predicted" in capsys.readouterr().out
    for png in ("speedup_by_category.png", "acceptance_by_position.png", "tokens_per_second_vs_k.png"):
        assert (out / png).stat().st_size > 1000


def test_bench_lookahead_and_layer_skip_methods(tiny_llama_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "s", "category": "qa", "prompt": "w5 w6 w5 w6 w5 w6"}) + "\n")
    out = tmp_path / "run"
    argv = ["bench", "--model", str(tiny_llama_dir), "--methods", "plain,lookahead,layer-skip:2", "--k", "4", "--dataset", str(data),
            "--max-new-tokens", "10", "--no-plots", "--out", str(out)]
    assert "--layer-skip" in cli_error(argv, capsys)
    assert main(argv + ["--layer-skip", "1", "--lookahead-window", "2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"plain", "lookahead", "layer-skip:2"}
    assert all(m["greedy_mismatches"] == [] for k, m in summary["methods"].items() if k != "plain")


def test_negative_draft_vocab_is_refused(tiny_llama_dir, tmp_path, capsys):
    argv = ["bench", "--model", str(tiny_llama_dir), "--methods", "plain", "--draft-vocab", "-5",
            "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    assert "--draft-vocab must be >= 0" in capsys.readouterr().err


def test_a_failing_peer_is_recorded_and_reported_not_fatal(tiny_llama_dir, tmp_path):
    from specdec.bench.compare import Comparison
    from specdec.bench.datasets import Prompt
    from specdec.bench.report import build_summary
    from specdec.model import load_model

    class BrokenPeer:
        def generate(self, *args):
            raise RuntimeError("peer exploded")

    target = load_model(str(tiny_llama_dir))
    specs = parse_methods("plain,hf", [4])
    records = Comparison(Parts(target, 64, cache=target.module.new_cache(64)), specs, 6, hf=BrokenPeer()).run(
        [Prompt("p", "c", ("w1 w2 w1",))], tmp_path / "r.jsonl")
    assert [r.method for r in records] == ["plain", "hf"] and "exploded" in records[1].error
    summary = build_summary(records, {"temperature": 0})
    assert set(summary["methods"]) == {"plain"} and summary["failures"][0]["method"] == "hf"


def test_report_only_summarizes_the_prompts_every_method_finished(tiny_llama_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": i, "category": "c", "prompt": "w1 w2 w1 w2"}) + "\n" for i in "ab"))
    out = tmp_path / "run"
    argv = ["bench", "--model", str(tiny_llama_dir), "--methods", "plain,ngram", "--dataset", str(data),
            "--max-new-tokens", "6", "--out", str(out), "--no-plots"]
    assert main(argv) == 0
    lines = (out / "records.jsonl").read_text().splitlines()
    (out / "records.jsonl").write_text("\n".join(lines[:3]) + "\n")  # as if stopped after a, ngram of b
    assert main(argv + ["--report-only"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["prompts_complete"] == 1 and summary["methods"]["plain"]["prompts"] == 1
    assert len((out / "records.jsonl").read_text().splitlines()) == 3  # nothing was run


def test_ignore_eos_runs_every_method_to_the_budget_and_refuses_peers(tiny_llama_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "s", "category": "qa", "prompt": "w5 w6 w5 w6 w5 w6"}) + "\n")
    out = tmp_path / "run"
    argv = ["bench", "--model", str(tiny_llama_dir), "--methods", "plain,ngram", "--k", "4", "--dataset", str(data),
            "--max-new-tokens", "12", "--temperature", "1.0", "--seed", "3", "--ignore-eos", "--no-plots",
            "--out", str(out)]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(len(r["tokens"]) == 12 for r in records)
    assert json.loads((out / "summary.json").read_text())["config"]["ignore_eos"] is True
    assert "peers" in cli_error(argv[:4] + ["plain,hf"] + argv[5:], capsys)


def test_a_prompt_with_a_suffix_fills_the_middle(tiny_fim_dir, tmp_path):
    """A dataset line with a suffix: every method (ours and a peer) gets the raw prefix and suffix around
    the fill-in-the-middle tokens, no chat template; a suffix beside several turns is a malformed line."""
    from specdec.bench.compare import Comparison
    from specdec.config import LLAMA_ORDER, GenerationConfig
    from specdec.drafters.base import NoDrafter
    from specdec.engine.engine import Engine
    from specdec.model import load_model
    from tests.conftest import FIM

    seen = []

    class Peer:
        def generate(self, ids, max_new_tokens, *args):
            seen.append(ids)
            return [1] * max_new_tokens, 0.01

    prompts = read_jsonl([json.dumps({"id": "f", "category": "fim", "prompt": "w1 w2", "suffix": "w3 w4 w1"}),
                          json.dumps({"turns": ["w1", "w2"], "suffix": "w3"})], "x.jsonl")
    assert len(prompts) == 1 and prompts[0].suffix == "w3 w4 w1"
    target = load_model(str(tiny_fim_dir))
    records = Comparison(Parts(target, 64, cache=target.module.new_cache(64)), parse_methods("plain,hf", [2]), 4,
                         hf=Peer()).run(prompts, tmp_path / "r.jsonl")
    ids = [FIM[0], 1, 2, FIM[1], 3, 4, 1, FIM[2]]
    assert seen[-1] == ids
    plain = Engine.single(target.module, NoDrafter(), 64).generate(ids, GenerationConfig(4, 2), target.eos_ids)
    assert [r.method for r in records] == ["plain", "hf"] and records[0].tokens == plain.tokens


def test_each_prompt_starts_one_method_further_on_after_a_warm_up(tiny_llama_dir, tmp_path):
    """What a method leaves behind (a peer's spinning threads, a cold cache) must not always land on the
    same next method, nor a model's first forward on the first method: the order rotates per prompt, and
    one untimed pass runs first."""
    from specdec.bench.compare import Comparison
    from specdec.bench.datasets import Prompt
    from specdec.model import load_model

    calls = []

    class Peer:
        def generate(self, ids, max_new_tokens, *args):
            calls.append(max_new_tokens)
            return [1] * max_new_tokens, 0.01

    target = load_model(str(tiny_llama_dir))
    specs = parse_methods("plain,ngram,hf", [2])
    prompts = [Prompt(i, "c", ("w1 w2 w1",)) for i in "abcd"]
    records = Comparison(Parts(target, 64, cache=target.module.new_cache(64)), specs, 4, hf=Peer()).run(
        prompts, tmp_path / "r.jsonl")
    assert [(r.prompt_id, r.method) for r in records] == [
        ("a", "plain"), ("a", "ngram"), ("a", "hf"), ("b", "ngram"), ("b", "hf"), ("b", "plain"),
        ("c", "hf"), ("c", "plain"), ("c", "ngram"), ("d", "plain"), ("d", "ngram"), ("d", "hf")]
    assert calls == [2, 4, 4, 4, 4]  # the warm-up's two tokens, then the four timed runs


def test_sampling_settings_reach_every_method(tiny_llama_dir, tmp_path, capsys, monkeypatch):
    """--top-k, --top-p, --min-p and the penalties: ours sample under them (greedy: still plain decoding's
    tokens, now penalised), the summary records them, llama-server gets them under its names, and HF
    peers, which have no presence or frequency penalty, are refused them."""
    from specdec.bench.llama_server import LlamaServerPeer
    from specdec.config import LLAMA_ORDER, SamplingParams
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "s", "category": "qa", "prompt": "w5 w6 w5 w6 w5 w6"}) + "\n")
    base = ["bench", "--model", str(tiny_llama_dir), "--methods", "plain,ngram", "--k", "3", "--dataset", str(data),
            "--max-new-tokens", "16", "--no-plots"]
    texts = []
    for extra in ([], ["--repetition-penalty", "1.8", "--presence-penalty", "0.5", "--min-p", "0.1"]):
        out = tmp_path / f"run{len(texts)}"
        assert main(base + extra + ["--out", str(out)]) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["methods"]["ngram"]["greedy_mismatches"] == []
        records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
        texts.append(records[0]["tokens"])
    assert texts[0] != texts[1]
    assert summary["config"]["sampling"]["repetition_penalty"] == 1.8 and summary["config"]["sampling"]["min_p"] == 0.1
    assert "presence" in cli_error(base + ["--presence-penalty", "0.5", "--methods", "plain,hf", "--out",
                                           str(tmp_path / "hf")], capsys)
    assert "min_p" in cli_error(base + ["--min-p", "2", "--out", str(tmp_path / "bad")], capsys)
    assert "whole text" in cli_error(base + ["--repetition-penalty", "1.1", "--repeat-last-n", "64", "--methods",
                                             "plain,hf", "--out", str(tmp_path / "hf2")], capsys)
    assert "penalty_last_n" in cli_error(base + ["--repeat-last-n", "-1", "--out", str(tmp_path / "bad2")], capsys)

    sent = []

    class Server:
        def complete(self, body):
            sent.append(body)
            return {"tokens": [1, 2]}
    peer = object.__new__(LlamaServerPeer)
    peer.eos, peer.n_ctx, peer.server = set(), 512, lambda *a: Server()
    peer.generate([3, 4], 2, sampling=SamplingParams(0.8, 40, 0.95, 7, 0.05, 1.1, 0.2, 0.3))
    peer.generate([3, 4], 2, sampling=SamplingParams(repetition_penalty=1.2))
    peer.generate([3, 4], 2, sampling=SamplingParams(repetition_penalty=1.2, penalty_last_n=64))
    assert sent[2]["repeat_last_n"] == 64  # the same window on both sides
    assert {k: sent[0][k] for k in ("temperature", "top_k", "top_p", "min_p", "seed", "repeat_penalty",
                                    "presence_penalty", "frequency_penalty", "repeat_last_n")} == {
        "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 7, "repeat_penalty": 1.1,
        "presence_penalty": 0.2, "frequency_penalty": 0.3, "repeat_last_n": 512}
    assert (sent[1]["temperature"], sent[1]["top_k"], sent[1]["repeat_penalty"]) == (0.0, 1, 1.2)
    assert sent[0]["samplers"] == ["penalties", "temperature", "min_p", "top_k", "top_p"]  # our order on both sides
    peer.generate([3, 4], 2, sampling=SamplingParams(0.8, 40, order=LLAMA_ORDER))
    assert sent[3]["samplers"] == ["penalties", "top_k", "top_p", "min_p", "temperature"]
    assert "own order" in cli_error(base + ["--temperature", "0.7", "--samplers", "top_k,temperature", "--methods",
                                            "plain,hf", "--out", str(tmp_path / "hf3")], capsys)
