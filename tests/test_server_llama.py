"""llama-server's own endpoints (/completion, /infill: server/llama_api.py) and the text rules of code
completion (n_indent, t_max_predict_ms: server/scheduler.py's TextTracker)."""

from __future__ import annotations

import json

import httpx
import pytest

from specdec.config import LLAMA_ORDER, GenerationConfig, SamplingParams
from specdec.engine.engine import Engine
from specdec.model.tokenizer import text_ids
from specdec.server import build_scheduler
from specdec.server.llama_api import SNIPPET, InfillRequest, infill_ids
from specdec.server.scheduler import TextTracker
from tests.conftest import FIM
from tests.test_server import CONTEXT, K, running, serve_args, text_of


class Chars:
    """A tokenizer whose ids are characters' code points."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def chars(s: str) -> list[int]:
    return [ord(c) for c in s]


def test_text_ends_before_a_later_line_indented_less():
    """llama-server's n_indent: the first line is never checked; a later line ends the text at its
    first character past the indentation once that indentation is short (an empty line too)."""
    tr = TextTracker(Chars(), indent=4)
    assert tr.add(chars("x = 1\n")) == ("x = 1\n", None)
    assert tr.add(chars("    y")) == ("    y", None)
    assert tr.add(chars(" = 2\n  ")) == (" = 2\n  ", None)  # the indentation is not decided yet
    assert tr.add(chars("z = 3\n")) == ("", "length")  # cut before z
    assert tr.text == "x = 1\n    y = 2\n  " and tr.add(chars("more")) == ("", "length")
    blank = TextTracker(Chars(), indent=2)
    assert blank.add(chars("a\n  b\n\nc")) == ("a\n  b\n", "length")
    tabs = TextTracker(Chars(), indent=2)
    assert tabs.add(chars("a\n\t\tb\n\tc")) == ("a\n\t\tb\n\t", "length")


def test_text_ends_at_a_line_end_once_overdue():
    """t_max_predict_ms: past the time, the text ends after the first line end among the new tokens
    (one already sent before does not count); the earliest of all ends wins."""
    tr = TextTracker(Chars())
    assert tr.add(chars("a\nb")) == ("a\nb", None)
    assert tr.add(chars("c"), overdue=True) == ("c", None)
    assert tr.add(chars("d\ne\nf"), overdue=True) == ("d\n", "length")
    assert tr.text == "a\nbcd\n"
    both = TextTracker(Chars(), stop=("e",))
    assert both.add(chars("xe\ny"), overdue=True) == ("x", "stop") and both.word == "e"


# ---- a server on the tiny model whose tokenizer spells FIM tokens (no repository tokens) ----

@pytest.fixture(scope="module")
def fim_server(tiny_fim_dir):
    sched = build_scheduler(*serve_args("--model", str(tiny_fim_dir), "--ngram", "--k", str(K), "--device", "cpu",
                                        "--max-context", str(CONTEXT), "--policy", "fixed"), progress=lambda m: None)
    with running(sched) as (base, _):
        yield base, sched


def engine_answer(sched, ids: list[int], n: int, sampling: SamplingParams = SamplingParams()):
    return Engine.single(sched.engine.target, sched.engine.drafter, CONTEXT).generate(
        ids, GenerationConfig(n, K, sampling), sched.eos_ids)


def stream_events(base: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", base + path, json=body | {"stream": True}, timeout=60) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def test_infill_layout_is_llama_servers(fim_server):
    """The extra chunks (each after a snippet line: this tokenizer has no file token) keep their last
    tokens that fit the room; then the prefix's last 1536 tokens with the prompt after them, the suffix's
    first 512 - 2 - len(prompt) tokens, between the FIM tokens."""
    tok = fim_server[1].tokenizer
    body = InfillRequest(input_prefix="w5 w17", input_suffix="w9", prompt="w3",
                         input_extra=[{"filename": "a.py", "text": "w7 w8"}, {"text": "w10 w11"}])
    snippet = text_ids(tok, SNIPPET)
    extra, tail = snippet + [7, 8] + snippet + [10, 11], [FIM[0], 5, 17, 3, FIM[1], 9, FIM[2]]
    assert infill_ids(tok, body, room=100) == extra + tail
    assert infill_ids(tok, body, room=3) == extra[-3:] + tail
    assert infill_ids(tok, body, room=-5) == tail
    long = InfillRequest(input_prefix=" ".join(f"w{i % 80}" for i in range(2000)), prompt="w3",
                         input_suffix=" ".join(f"w{i % 80}" for i in range(600)))
    ids = infill_ids(tok, long, room=0)
    assert ids == ([FIM[0]] + [i % 80 for i in range(2000 - 1536, 2000)] + [3, FIM[1]]
                   + [i % 80 for i in range(509)] + [FIM[2]])


def test_infill_is_the_engines_answer_on_llama_servers_layout(fim_server):
    """The answer as the engine gives it for the layout's ids (the extra chunk does not fit this small
    context: dropped, as llama-server drops it), whole and streamed, in llama-server's fields."""
    base, sched = fim_server
    body = {"input_prefix": "w5 w17", "input_suffix": "w9 w5 w17 w3 w40", "prompt": "w3", "n_predict": 20,
            "temperature": 0, "input_extra": [{"filename": "a.py", "text": "w7 w8"}]}
    ids = [FIM[0], 5, 17, 3, FIM[1], 9, 5, 17, 3, 40, FIM[2]]
    ref = engine_answer(sched, ids, 20)
    r = httpx.post(base + "/infill", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["content"] == text_of(sched, ref.tokens) and out["stop"] is True
    assert out["tokens_evaluated"] == len(ids) and out["tokens_predicted"] == len(ref.tokens)
    assert out["stop_type"] == {"stop": "eos", "length": "limit"}[ref.finish_reason]
    assert out["timings"]["predicted_n"] == len(ref.tokens) and out["generation_settings"]["temperature"] == 0
    assert out["timings"].get("draft_n", 0) == ref.stats.drafted == out["speculative"]["drafted"]
    assert out["timings"].get("draft_n_accepted", 0) == ref.stats.accepted
    events = stream_events(base, "/infill", body)
    assert "".join(e["content"] for e in events) == out["content"]
    assert [e["stop"] for e in events].count(True) == 1 and events[-1]["stop"] is True
    assert events[-1]["tokens_predicted"] == len(ref.tokens) and len(events) > 2


SAMPLERS_OF = {"['top_k', 'top_p']": {"top_k", "top_p"}, "kt": {"top_k", "temperature"},
               "['temperature', 'top_p', 'min_p']": {"temperature", "top_p", "min_p"}}


def test_completion_takes_llama_servers_defaults_and_samplers(fim_server):
    """/completion samples at llama-server's defaults (T 0.8, top-k 40, top-p 0.95, min-p 0.05, in
    llama.cpp's order: the temperature last) from the seed; `samplers` turns off what it leaves out (no
    temperature: the logits as they are) and orders what it names."""
    base, sched = fim_server
    ids = [5, 17, 3, 9]
    for extra, sampling in (({}, SamplingParams(0.8, 40, 0.95, 7, 0.05, order=LLAMA_ORDER)),
                            ({"samplers": ["top_k", "top_p"]}, SamplingParams(1.0, 40, 0.95, 7, order=LLAMA_ORDER)),
                            ({"samplers": "kt", "temperature": 0.5}, SamplingParams(
                                0.5, 40, 1.0, 7, order=("top_k", "temperature", "top_p", "min_p"))),
                            ({"samplers": ["temperature", "top_p", "min_p"], "temperature": 1.5}, SamplingParams(
                                1.5, 0, 0.95, 7, 0.05, order=("temperature", "top_p", "min_p", "top_k")))):
        ref = engine_answer(sched, ids, 24, sampling)
        r = httpx.post(base + "/completion", json={"prompt": "w5 w17 w3 w9", "n_predict": 24, "seed": 7} | extra,
                       timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["content"] == text_of(sched, ref.tokens), extra
        settings = out["generation_settings"]
        assert (settings["temperature"], settings["top_k"], settings["top_p"], settings["min_p"]) == (
            sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p)
        named = [s for s in sampling.order if "samplers" not in extra or s in SAMPLERS_OF[str(extra["samplers"])]]
        assert settings["samplers"] == ["penalties"] * ("samplers" not in extra) + named


def test_completion_stops_at_words_and_counts_and_bans_by_bias(fim_server):
    base, sched = fim_server
    ids = [5, 17, 3, 9]
    ref = engine_answer(sched, ids, 30)
    words = text_of(sched, ref.tokens).split()
    assert len(words) > 4
    stop = words[3]
    r = httpx.post(base + "/completions", json={"prompt": ids, "n_predict": 30, "temperature": 0, "stop": [stop]},
                   timeout=60).json()
    assert r["stop_type"] == "word" and r["stopping_word"] == stop
    assert r["content"] == text_of(sched, ref.tokens).split(stop)[0]
    r = httpx.post(base + "/completion", json={"prompt": ids, "n_predict": 0}, timeout=60).json()
    assert (r["content"], r["tokens_predicted"], r["stop_type"]) == ("", 0, "limit")
    banned = ref.tokens[0]
    biased = engine_answer(sched, ids, 30, SamplingParams(logit_bias=((banned, -100.0),)))
    r = httpx.post(base + "/completion", json={"prompt": ids, "n_predict": 30, "temperature": 0,
                                               "logit_bias": [[banned, False]]}, timeout=60).json()
    assert r["content"] == text_of(sched, biased.tokens) and banned not in biased.tokens


def test_penalties_count_llama_cpps_window(fim_server):
    """repeat_last_n: the penalties over the last n tokens of the prompt and answer (default 64, -1 all of
    them, 0 none), greedy token for token as the engine's plain decoding under the same counting; the
    OpenAI endpoint takes it too."""
    from specdec.drafters.base import NoDrafter
    base, sched = fim_server
    ids = [5, 17, 3, 5, 17, 3, 5]
    plain = Engine.single(sched.engine.target, NoDrafter(), CONTEXT)
    pen = dict(repetition_penalty=1.5, presence_penalty=0.6, frequency_penalty=0.4)

    def want(last_n):
        return text_of(sched, plain.generate(ids, GenerationConfig(30, K, SamplingParams(**pen, penalty_last_n=last_n)),
                                             sched.eos_ids).tokens)
    body = {"prompt": ids, "n_predict": 30, "temperature": 0, "repeat_penalty": 1.5, "presence_penalty": 0.6,
            "frequency_penalty": 0.4}
    outs = {}
    for last_n, window in ((3, 3), (None, 64), (-1, CONTEXT)):
        got = httpx.post(base + "/completion", json=body | ({} if last_n is None else {"repeat_last_n": last_n}),
                         timeout=60).json()["content"]
        assert got == want(window), last_n
        outs[window] = got
    assert outs[3] != outs[64]  # the window matters here
    off = httpx.post(base + "/completion", json=body | {"repeat_last_n": 0}, timeout=60).json()["content"]
    assert off == text_of(sched, plain.generate(ids, GenerationConfig(30, K), sched.eos_ids).tokens)
    oai = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": ids, "max_tokens": 30,
                                                     "temperature": 0, "repeat_last_n": 3, **pen}, timeout=60)
    assert oai.json()["choices"][0]["text"] == outs[3]


def test_bad_llama_requests_are_clear_400s(fim_server, tiny_llama_dir):
    base, _ = fim_server
    for body, word in (({"prompt": "w5", "mirostat": 2}, "mirostat"), ({"prompt": "w5", "typical_p": 0.5}, "typical_p"),
                       ({"prompt": "w5", "repeat_last_n": -2}, "repeat_last_n"),
                       ({"prompt": "w5", "lora": [{"id": 0, "scale": 0.5}]}, "lora"),
                       ({"prompt": "w5", "logit_bias": [[5]]}, "logit_bias"), ({"prompt": ""}, "prompt"),
                       ({"prompt": "w5", "n_predict": -2}, "n_predict")):
        r = httpx.post(base + "/completion", json=body, timeout=30)
        assert r.status_code == 400 and word in r.text, (body, r.text)
    r = httpx.post(base + "/infill", json={"input_suffix": "w5"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_prefix"
    sched = build_scheduler(*serve_args("--model", str(tiny_llama_dir), "--device", "cpu", "--max-context",
                                        str(CONTEXT)), progress=lambda m: None)
    with running(sched) as (plain_base, _):  # no fill-in-the-middle tokens
        r = httpx.post(plain_base + "/infill", json={"input_prefix": "w5", "input_suffix": "w6"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "input_prefix"
        assert "fill-in-the-middle" in r.json()["error"]["message"]


# ---- the real Qwen2.5-Coder 0.5B: repository tokens, and n_indent on real code ----

def indent_cut(text: str, n: int) -> str:
    """llama-server's n_indent rule, written out on lines: the text up to the first character past the
    indentation of the first later line indented by fewer than n spaces or tabs (an empty line too)."""
    lines = text.split("\n")
    for i in range(1, len(lines)):
        line = lines[i]
        ws = len(line) - len(line.lstrip(" \t"))
        decided = ws < len(line) or i < len(lines) - 1  # something follows the indentation
        if decided and ws < n:
            return "\n".join(lines[:i]) + "\n" + line[:ws]
    return text


@pytest.fixture(scope="module")
def coder_server():
    from specdec.model.registry import pull
    path = pull("qwen2.5-coder-0.5b-instruct")
    sched = build_scheduler(*serve_args("--model", str(path), "--ngram", "--device", "cpu", "--max-context", "4096"),
                            progress=lambda m: None)
    with running(sched) as (base, _):
        yield base, sched


def test_infill_on_a_coder_model_lays_out_its_repository_and_ends_lines_by_indentation_and_time(coder_server):
    base, sched = coder_server
    tok = sched.tokenizer
    vocab = tok.get_vocab()
    prefix = "def mean(xs):\n    total = 0\n    for x in xs:\n"
    suffix = "\n\nprint(mean([1, 2, 3]))\n"
    body = {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 48, "temperature": 0,
            "input_extra": [{"filename": "util.py", "text": "def square(x):\n    return x * x\n"}]}

    def enc(s):
        return tok.encode(s, add_special_tokens=False)
    ids = ([vocab["<|repo_name|>"]] + enc("myproject\n") + [vocab["<|file_sep|>"]] + enc("util.py\n")
           + enc("def square(x):\n    return x * x\n") + [vocab["<|file_sep|>"]] + enc("filename\n")
           + [vocab["<|fim_prefix|>"]] + enc(prefix) + [vocab["<|fim_suffix|>"]] + enc(suffix)
           + [vocab["<|fim_middle|>"]])
    ref = Engine.single(sched.engine.target, sched.engine.drafter, 4096).generate(ids, GenerationConfig(48, 4),
                                                                                 sched.eos_ids)
    whole = httpx.post(base + "/infill", json=body, timeout=120).json()
    assert whole["tokens_evaluated"] == len(ids) and whole["content"] == text_of(sched, ref.tokens)
    assert "\n" in whole["content"].rstrip("\n")  # more than one line: the indentation rule has lines to judge
    shortened = 0
    for n in (4, 8):
        cut = httpx.post(base + "/infill", json=body | {"n_indent": n}, timeout=120).json()
        assert cut["content"] == indent_cut(whole["content"], n), n
        if cut["content"] != whole["content"]:
            assert cut["stop_type"] == "limit"
            shortened += 1
    assert shortened  # the rule cut at least one answer short
    late = httpx.post(base + "/infill", json=body | {"t_max_predict_ms": 1}, timeout=120).json()
    first_line = whole["content"][:whole["content"].index("\n") + 1]  # past 1 ms, the first line end ends it
    assert late["content"] == first_line and late["stop_type"] == "limit"


def test_infill_bench_reads_this_servers_answers(fim_server):
    """scripts/infill_bench.py's requests against this server (llama-server's run the same way, not here):
    each gap in both modes, the plain ones drafting nothing, and the summary's sums and ratios."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("infill_bench", Path(__file__).parents[1] / "scripts/infill_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    base, _ = fim_server
    gaps = [{"id": "a", "prompt": "w5 w17 w3", "suffix": "w9 w5"}, {"id": "b", "prompt": "w8 w8 w8", "suffix": "w2"}]
    typing = bench.typed([{"id": "g", "prompt": "w1", "suffix": "w2", "middle": " w3 w4"}], 3, 3)
    assert [(g["id"], g["prompt"]) for g in typing] == [("g+0", "w1"), ("g+3", "w1 w3"), ("g+6", "w1 w3 w4")]
    rows = bench.run_gaps(base, gaps, 12, ("spec", "plain"))
    assert [(r["id"], r["mode"]) for r in rows] == [("a", "spec"), ("b", "spec"), ("a", "plain"), ("b", "plain")]
    assert all(r["draft_n"] == 0 for r in rows if r["mode"] == "plain") and all(r["predicted_n"] > 0 for r in rows)
    summary = bench.summarize([r | {"server": "specdec"} for r in rows])
    plain, spec_row = summary["specdec plain"], summary["specdec spec"]
    assert plain["tokens"] == sum(r["predicted_n"] for r in rows if r["mode"] == "plain")
    assert plain["rate_vs_specdec_plain"] == 1.0 and spec_row["same_as_plain"] == "2/2"  # greedy: the same answers
    assert spec_row["tokens_per_second"] == round(1000.0 * spec_row["tokens"] / sum(
        r["predicted_ms"] for r in rows if r["mode"] == "spec"), 2)


def test_props_gives_the_llama_endpoints_defaults(fim_server):
    """/props, as llama-server's: the defaults /completion and /infill apply, the context and the slots."""
    base, sched = fim_server
    props = httpx.get(base + "/props", timeout=30).json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == CONTEXT == sched.context and props["total_slots"] == sched.engine.max_batch
    assert (settings["params"]["temperature"], settings["params"]["top_k"], settings["params"]["min_p"]) == (0.8, 40, 0.05)
    assert settings["params"]["repeat_last_n"] == 64 and props["model_alias"] == "tiny"
    answer = httpx.post(base + "/completion", json={"prompt": "w5", "n_predict": 2}, timeout=30).json()
    assert answer["generation_settings"] == settings["params"] | {"n_predict": 2}


def test_llama_vscodes_sampling_with_the_infill_sampler_is_the_engines(coder_server):
    """llama.vscode's request (samplers top_k, top_p, infill; top-k 40, top-p 0.99; no temperature: the
    logits as they are): decoded plain (speculative.n_max 0), the answer is the engine's from the seed
    under llama.cpp's infill sampler, in the samplers' order; drafting (this server's policy times its
    steps, so a sampled answer is not repeatable token for token) it answers too."""
    from specdec.constraints.vocab import Vocabulary
    from specdec.server.llama_api import infill_vocabulary
    base, sched = coder_server
    tok = sched.tokenizer
    vocab = infill_vocabulary(Vocabulary.build(tok, sched.engine.target.config.vocab_size,
                                               sorted(sched.eos_ids)).tokenizer, sched.eos_ids, tok.eos_token_id)
    prefix, suffix = "def mean(xs):\n    total = 0\n    for x in xs:\n", "\n    return total / len(xs)\n"
    body = {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 24, "top_k": 40, "top_p": 0.99,
            "samplers": ["top_k", "top_p", "infill"], "seed": 3}
    ids = infill_ids(tok, InfillRequest(**body), 4096)
    order = ("top_k", "top_p", "infill", "min_p", "temperature")
    from specdec.drafters.base import NoDrafter
    ref = Engine.single(sched.engine.target, NoDrafter(), 4096).generate(
        ids, GenerationConfig(24, 1, SamplingParams(1.0, 40, 0.99, 3, order=order, infill_vocab=vocab)), sched.eos_ids)
    without = Engine.single(sched.engine.target, NoDrafter(), 4096).generate(
        ids, GenerationConfig(24, 1, SamplingParams(1.0, 40, 0.99, 3, order=order[:2] + order[3:])), sched.eos_ids)
    assert ref.tokens != without.tokens  # the infill sampler changes this answer
    r = httpx.post(base + "/infill", json=body | {"speculative.n_max": 0}, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["generation_settings"]["samplers"] == ["top_k", "top_p", "infill"]
    assert out["content"] == text_of(sched, ref.tokens) and out["content"].strip()
    drafted = httpx.post(base + "/infill", json=body, timeout=120)
    assert drafted.status_code == 200 and drafted.json()["content"].strip()


def test_the_infill_sampler_on_a_tokenizer_the_grammar_engine_cannot_read_is_a_400(fim_server):
    base, _ = fim_server  # its word-level test tokenizer has no decoder the grammar engine knows
    r = httpx.post(base + "/completion", json={"prompt": "w5 w17", "n_predict": 4, "samplers": ["top_k", "infill"]},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "samplers", r.text
    assert "infill sampler" in r.json()["error"]["message"]


def test_infill_bench_samples_as_llama_vscode_against_this_server(coder_server):
    """scripts/infill_bench.py --vscode-sampling: llama.vscode's samplers, the infill sampler among them,
    applied (generation_settings) and answered in both modes."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("infill_bench", Path(__file__).parents[1] / "scripts/infill_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    base, _ = coder_server
    gap = {"id": "g", "prompt": "def mean(xs):\n    total = 0\n", "suffix": "\n    return total / len(xs)\n"}
    rows = bench.run_gaps(base, [gap], 16, ("spec", "plain"), vscode=True)
    assert [r["mode"] for r in rows] == ["spec", "plain"] and all(r["predicted_n"] > 0 for r in rows)
    body = {"input_prefix": gap["prompt"], "input_suffix": gap["suffix"], "n_predict": 4} | bench.VSCODE
    settings = httpx.post(base + "/infill", json=body, timeout=60).json()["generation_settings"]
    assert settings["samplers"] == ["top_k", "top_p", "infill"] and (settings["top_k"], settings["top_p"]) == (40, 0.99)
