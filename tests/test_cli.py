"""The CLI on bad input: one clear `specdec: error: ...` line, exit code 2, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specdec.cli import build_parser, main
from specdec.errors import SpecdecError
from specdec.model.registry import load_registry
from specdec.model.tokenizer import check_compatible

LONG_PROMPT = "Speculative decoding drafts several tokens and verifies them in one pass. " * 6


def cli_error(argv: list[str], capsys) -> str:
    """Run main(argv) in-process; it must return 2 with a one-line error and no traceback."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("specdec: error: ")
    return last


def argparse_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err
    return err


@pytest.fixture
def tmp_home(tmp_path, monkeypatch):
    """A private SPECDEC_HOME, so nothing is written or pulled into the real cache."""
    home = tmp_path / "home"
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    return home


@pytest.fixture
def no_model_loads(monkeypatch):
    """Flag errors must be raised before any model is read."""
    def fail(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were validated")
    monkeypatch.setattr("specdec.model.load_model", fail)


def test_unknown_model_name_lists_known_names(capsys, tmp_home):
    msg = cli_error(["generate", "--model", "no-such-model", "hi"], capsys)
    assert "no-such-model" in msg
    for name in load_registry():
        assert name in msg


def test_missing_model_file(capsys, tmp_home):
    msg = cli_error(["generate", "--model", "/nonexistent/x.gguf", "hi"], capsys)
    assert "not found" in msg and "/nonexistent/x.gguf" in msg


def test_corrupt_gguf(capsys, tmp_home, tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(os.urandom(4096))
    msg = cli_error(["generate", "--model", str(bad), "hi"], capsys)
    assert "not a readable GGUF" in msg and "corrupt" in msg
    assert not tmp_home.exists() or not any(tmp_home.rglob("*.gguf"))


@pytest.mark.real
def test_truncated_gguf(capsys, smollm2_path, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SPECDEC_HOME", str(home))  # set after smollm2_path was resolved in the real home
    partial = tmp_path / "x.gguf"
    with open(smollm2_path, "rb") as src:
        partial.write_bytes(src.read(1 << 20))
    msg = cli_error(["generate", "--model", str(partial), "hi"], capsys)
    assert "not a readable GGUF" in msg and "truncated" in msg


@pytest.mark.real
def test_a_draft_with_a_lossy_other_tokenizer_is_refused(capsys, smollm2_path, tiny_llama_dir):
    """The tiny draft's word-level tokenizer differs from SmolLM2's and loses text (spaces, unknown words)."""
    msg = cli_error(["generate", "--model", str(smollm2_path), "--draft", str(tiny_llama_dir), "hi"], capsys)
    assert "tokenizer differs from the target's" in msg and "losslessly" in msg and "comes back" in msg


class FakeTokenizer:
    def __init__(self, vocab: dict[str, int]):
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


def vocab(n: int) -> dict[str, int]:
    return {f"t{i}": i for i in range(n)}


def test_check_compatible():
    check_compatible(FakeTokenizer(vocab(1000)), FakeTokenizer(vocab(1000)))
    check_compatible(FakeTokenizer(vocab(1000)), FakeTokenizer(vocab(1000 - 128)))  # a few extra ids is fine
    with pytest.raises(SpecdecError, match="vocabulary"):
        check_compatible(FakeTokenizer(vocab(1000)), FakeTokenizer(vocab(1000 - 129)))
    swapped = vocab(1000) | {"t7": 8, "t8": 7}
    with pytest.raises(SpecdecError, match="disagree.*id [78]"):
        check_compatible(FakeTokenizer(vocab(1000)), FakeTokenizer(swapped))
    renamed = {("other" if s == "t500" else s): i for s, i in vocab(1000).items()}
    with pytest.raises(SpecdecError, match="'other'.*'t500'"):
        check_compatible(FakeTokenizer(vocab(1000)), FakeTokenizer(renamed))


@pytest.mark.parametrize("flags, field", [
    (["--k", "0"], "--k must be >= 1"),
    (["--temperature", "-1"], "temperature"),
    (["--temperature", "nan"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--top-p", "1.5"], "top_p"),
    (["--top-k", "-1"], "top_k"),
    (["--max-context", "0"], "--max-context must be >= 1"),
    (["--max-context", "-1"], "--max-context must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--ngram", "--ngram-min", "0"], "min_n"),
    (["--ngram", "--ngram-max", "1", "--ngram-min", "2"], "max_n"),
    (["--seed", str(2**64)], "seed"),
    (["--seed", "-1"], "seed"),
    (["--draft-p-min", "1.5"], "p_min"),
    (["--draft-window", "-1"], "--draft-window"),
])
def test_bad_flag_values_fail_before_loading(flags, field, capsys, no_model_loads):
    msg = cli_error(["generate", *flags, "hi"], capsys)
    assert field in msg


@pytest.mark.parametrize("flags, name", [
    (["--k", "abc"], "--k"),
    (["--max-new-tokens", "1.5"], "--max-new-tokens"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--temperature", "hot"], "--temperature"),
    (["--draft-bits", "5"], "--draft-bits"),
    (["--draft-bits", "three"], "--draft-bits"),
])
def test_non_numeric_flags_are_argparse_errors(flags, name, capsys, no_model_loads):
    err = argparse_error(["generate", *flags, "hi"], capsys)
    assert name in err


def test_threads_set_torchs_threads_before_the_model_loads(monkeypatch):
    """--threads N (-t N, as llama.cpp's) is torch's thread count, which the kernels take, from the load on."""
    import torch

    import specdec.model
    from specdec.settings import ModelSettings
    args = build_parser().parse_args(["generate", "-t", "1", "hi"])
    assert args.threads == 1 and build_parser().parse_args(["generate", "hi"]).threads is None
    seen = []
    monkeypatch.setattr(specdec.model, "load_model", lambda *a, **k: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    try:
        ModelSettings(threads=1).load(progress=lambda *a: None)
        assert seen == [1]
        ModelSettings().load(progress=lambda *a: None)  # no flag: left as it is
        assert seen == [1, 1]
    finally:
        torch.set_num_threads(before)


def test_draft_bits_take_a_width_or_auto():
    parse = lambda *f: build_parser().parse_args(["generate", *f, "hi"]).draft_bits  # noqa: E731
    assert parse() is None and parse("--draft-bits", "auto") is None  # auto: the kernel build's best
    assert [parse("--draft-bits", b) for b in ("3", "4", "8")] == [3, 4, 8]


def test_two_drafting_methods_are_refused(capsys, no_model_loads):
    msg = cli_error(["generate", "--ngram", "--suffix", "hi"], capsys)
    assert "--ngram" in msg and "--suffix" in msg


def test_ngram_with_a_draft_model_is_the_hybrid_and_matches_plain(capsys, tiny_llama_dir):
    base = ["generate", "--model", str(tiny_llama_dir), "--max-new-tokens", "12", "--json", "w1 w2 w3 w1 w2"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"]
    assert main(base[:1] + ["--draft", str(tiny_llama_dir), "--ngram", "--policy", "adaptive"] + base[1:]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["text"] == plain and "prompt lookup" in out["method"]


def test_infill_fills_the_middle_speculatively_and_refuses_what_cannot(capsys, tiny_fim_dir, tiny_llama_dir):
    """--infill SUFFIX: the prompt and the suffix around the fill-in-the-middle tokens, answered as the
    engine answers those ids (plain and with a drafter, the same text); a model without the tokens, or
    --chat, is a one-line error."""
    from specdec.config import GenerationConfig
    from specdec.drafters.base import NoDrafter
    from specdec.engine.engine import Engine
    from specdec.model import load_model
    from tests.conftest import FIM
    target = load_model(str(tiny_fim_dir))
    ref = Engine.single(target.module, NoDrafter(), 64).generate(
        [FIM[0], 1, 2, 3, FIM[1], 4, 1, 2, FIM[2]], GenerationConfig(10, 1), target.eos_ids)
    base = ["generate", "--model", str(tiny_fim_dir), "--max-new-tokens", "10", "--json", "--infill", "w4 w1 w2",
            "w1 w2 w3"]
    for extra in ([], ["--ngram"], ["--draft", str(tiny_fim_dir)]):
        assert main(base[:1] + extra + base[1:]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["text"] == target.tokenizer.decode(ref.tokens, skip_special_tokens=True), extra
    assert "--chat" in cli_error(base[:1] + ["--chat"] + base[1:], capsys)
    msg = cli_error(["generate", "--model", str(tiny_llama_dir), "--infill", "w3", "w1 w2"], capsys)
    assert "fill-in-the-middle" in msg


def test_bench_and_serve_refuse_a_negative_draft_window(capsys, no_model_loads):
    assert "--draft-window" in cli_error(["bench", "--methods", "plain,draft", "--draft-window", "-2"], capsys)
    assert "--draft-window" in cli_error(["serve", "--draft-window", "-2"], capsys)


@pytest.mark.parametrize("policy", ["adaptive", "adaptive-k"])
def test_adaptive_policies_with_a_draft_window_match_plain(capsys, tiny_llama_dir, policy):
    base = ["generate", "--model", str(tiny_llama_dir), "--max-new-tokens", "12", "--json", "w1 w2 w3 w1 w2 w3 w4"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"]
    assert main(base[:1] + ["--draft", str(tiny_llama_dir), "--policy", policy, "--draft-window", "2"] + base[1:]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"] == plain


def test_cuda_without_cuda_and_fp16_on_cpu(capsys, tiny_llama_dir, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CUDA" in cli_error(["generate", "--model", str(tiny_llama_dir), "--device", "cuda", "w1"], capsys)
    msg = cli_error(["generate", "--model", str(tiny_llama_dir), "--dtype", "float16", "w1"], capsys)
    assert "float16" in msg
    msg = cli_error(["generate", "--model", str(tiny_llama_dir), "--cuda-graphs", "w1"], capsys)
    assert "--cuda-graphs needs a CUDA device" in msg
    msg = cli_error(["generate", "--model", str(tiny_llama_dir), "--gpu-kernels", "w1"], capsys)
    assert "--gpu-kernels needs a CUDA device" in msg


def test_empty_prompt(capsys, tiny_llama_dir):
    msg = cli_error(["generate", "--model", str(tiny_llama_dir), ""], capsys)
    assert "prompt is empty" in msg


@pytest.mark.real
def test_prompt_longer_than_context(capsys, smollm2_path):
    argv = ["generate", "--model", str(smollm2_path), "--max-context", "32", "--max-new-tokens", "1", LONG_PROMPT]
    msg = cli_error(argv, capsys)
    assert "context of 32 tokens" in msg and "--max-context" in msg


def test_pull_unknown_name(capsys, tmp_home):
    msg = cli_error(["pull", "no-such-model"], capsys)
    assert "unknown model name" in msg and "smollm2-135m-instruct" in msg
    assert not (tmp_home / "models").exists()


def test_subprocess_error_has_no_traceback(tmp_path):
    env = {**os.environ, "SPECDEC_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", "--model", "no-such-model", "hi"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    assert "error" in proc.stderr and "no-such-model" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_models_lists_registry(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in load_registry():
        assert name in out


@pytest.mark.real
def test_generate_json(capsys, smollm2_path):
    code = main(["generate", "--model", str(smollm2_path), "--ngram", "--policy", "fixed", "--max-new-tokens", "8",
                 "--json", "def add(a, b):"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = captured.out.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert set(result) == {"text", "method", "stats"}
    assert isinstance(result["text"], str) and result["text"]
    stats = result["stats"]
    for key in ("new_tokens", "steps", "alpha", "tau", "per_position_acceptance", "draft_seconds",
                "verify_seconds", "seconds", "tokens_per_second"):
        assert key in stats
    assert 1 <= stats["new_tokens"] <= 8
    assert 1 <= stats["steps"] <= stats["new_tokens"]
    assert 0.0 <= stats["alpha"] <= 1.0 and stats["tau"] >= 1.0
    assert stats["seconds"] > 0


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_the_defaults_are_the_best_measured_settings(command):
    args = build_parser().parse_args([command, "--draft", "D"] + (["hi"] if command == "generate" else []))
    assert (args.policy, args.k, args.draft_vocab) == ("adaptive", 4, 32768)


def test_bench_defaults_put_the_policy_next_to_the_best_fixed_k():
    args = build_parser().parse_args(["bench"])
    assert (args.k, args.draft_vocab) == ("2,auto", 32768)


def test_generate_with_the_adaptive_policy(capsys, tiny_llama_dir, tmp_path):
    argv = ["generate", "--model", str(tiny_llama_dir), "--ngram", "--policy", "adaptive", "--k", "6",
            "--max-new-tokens", "20", "--json", "w1 w2 w3 w1 w2 w3 w1 w2"]
    assert main(argv) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["stats"]
    assert sum(stats["k_chosen"]) == stats["steps"] and len(stats["k_chosen"]) <= 7
    (tmp_path / "bad.json").write_text("{}")
    assert "profile" in cli_error(argv[:-1] + ["--cost-profile", str(tmp_path / "bad.json"), "w1"], capsys)


def test_generate_with_layer_skip_matches_plain(capsys, tiny_llama_dir):
    base = ["generate", "--model", str(tiny_llama_dir), "--max-new-tokens", "12", "--json", "w1 w2 w3 w1 w2"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"]
    assert main(base[:1] + ["--layer-skip", "1", "--policy", "fixed"] + base[1:]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"] == plain
    assert "layer" in cli_error(base[:1] + ["--layer-skip", "9"] + base[1:], capsys).lower()
    assert "one drafting method" in cli_error(base[:1] + ["--layer-skip", "1", "--ngram"] + base[1:], capsys)


def test_generate_with_lookahead_matches_plain(capsys, tiny_llama_dir):
    base = ["generate", "--model", str(tiny_llama_dir), "--max-new-tokens", "12", "--json", "w1 w2 w3 w1 w2"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"]
    assert main(base[:1] + ["--lookahead", "--lookahead-window", "2", "--lookahead-ngram", "4", "--policy", "fixed"]
                + base[1:]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"] == plain
    assert "lookahead" in cli_error(base[:1] + ["--lookahead", "--lookahead-ngram", "1"] + base[1:], capsys)
    assert "one drafting method" in cli_error(base[:1] + ["--lookahead", "--suffix"] + base[1:], capsys)


def test_weight_dtype_errors_are_clear(capsys, tmp_home):
    msg = cli_error(["generate", "--device", "cpu", "--dtype", "bfloat16", "hi"], capsys)
    assert "bfloat16 is not supported on the CPU" in msg
    for removed in ("int4", "bfloat16", "gguf"):
        assert "invalid choice" in argparse_error(["generate", "--weight-dtype", removed, "hi"], capsys)


def test_gguf_weights_where_there_are_none_is_a_clear_error(capsys, tiny_llama_dir, smollm2_path, monkeypatch):
    base = ["generate", "--model", str(tiny_llama_dir), "--max-new-tokens", "4", "--json", "w1 w2"]
    assert "is not a .gguf file" in cli_error(base[:1] + ["--weight-dtype", "gguf-q8"] + base[1:], capsys)
    assert main(base[:1] + ["--weight-dtype", "auto"] + base[1:]) == 0  # auto: the reference for an HF directory
    monkeypatch.setattr("specdec.model.cpu_kernels.available", lambda: False)
    monkeypatch.setattr("specdec.model.cpu_kernels.unavailable_reason", lambda: "no C compiler")
    msg = cli_error(["generate", "--model", str(smollm2_path), "--weight-dtype", "gguf-q8", "hi"], capsys)
    assert "needs our CPU kernels" in msg and "no C compiler" in msg


def test_profile_rejects_a_negative_draft_vocab(capsys, monkeypatch):
    monkeypatch.setattr("specdec.model.load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    assert "--draft-vocab must be >= 0" in cli_error(["profile", "--draft-vocab", "-1"], capsys)


@pytest.mark.real
def test_generate_under_a_structure_and_its_bad_inputs(capsys, smollm2_path, tmp_path):
    """--json-schema from a file gives JSON that matches it; a malformed schema, regex or grammar, or
    two structure flags at once, is a clear error and a non-zero exit, never a traceback."""
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                                  "additionalProperties": False}))
    base = ["generate", "--model", str(smollm2_path), "--ngram", "--max-new-tokens", "16", "--json"]
    assert main(base + ["--json-schema", str(schema), "Is the sky blue?"]) == 0
    assert isinstance(json.loads(json.loads(capsys.readouterr().out)["text"])["ok"], bool)
    for bad, message in ((["--json-schema", "{not json"], "not valid JSON"), (["--regex", "bad("], "regex"),
                         (["--grammar", "root ::= ("], "grammar"), (["--json-schema", "[1, 2]"], "JSON object")):
        assert main(base + bad + ["x"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("specdec: error:") and message in err and "Traceback" not in err
    with pytest.raises(SystemExit) as e:  # argparse: the structure flags exclude each other
        main(base + ["--regex", "a", "--json-object", "x"])
    assert e.value.code == 2
