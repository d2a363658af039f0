"""The GPU bench's own code (specdec/bench/synthetic.py, scripts/cuda_bench.py) on tiny shapes on the CPU,
so that it cannot rot between GPU sessions: the successor models keep every verify path on plain
decoding's tokens in bf16 too, and the oracle measures the acceptance it states."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec.bench.synthetic import OracleDrafter, measure, successor_model
from specdec.config import SamplingParams
from specdec.drafters.base import DraftState

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.cuda.is_available()


def prompt(n: int = 48, vocab: int = 512) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(0)).tolist()


def test_cuda_bench_script_runs_on_cpu(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(ROOT / "scripts/cuda_bench.py"), "--device", "cpu", "--target", "tiny-target",
           "--draft", "tiny-draft", "--context", "48", "--new-tokens", "65", "--alphas", "0.6,0.9",
           "--profile-repeats", "2", "--bandwidth-mb", "8", "--repeats", "1", "--compile", "default", "--out", str(out),
           "--modes", "eager,kernels", "--hf-compile"]  # kernels: the Triton layer loop, in Triton's interpreter
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=300,
                   env={**os.environ, "TRITON_INTERPRET": "1"})
    report = json.loads(out.read_text())
    if shutil.which("g++") or shutil.which("c++"):  # Inductor compiled the plain step, and HF's forward
        assert report["compiled"]["step_seconds"] > 0, report["compiled"]
        assert report["hf_static_compiled"]["follows_successor"], report["hf_static_compiled"]
    else:  # without a C++ compiler it cannot, and the bench says so and keeps the rest
        assert "error" in report["compiled"] and "error" in report["hf_static_compiled"]
    eager = report["modes"]["eager"]
    assert set(eager["verify_cost"]) == {"1", "2", "3", "5", "9", "17", "33"}
    assert eager["draft_cost_ratio"] > 0 and eager["plain_decode_tokens_per_second"] > 0
    assert eager["chain_cost_ratio_host"] > 0 and eager["chain_cost_ratio_device"] > 0 and eager["head_cost_ratio"] > 0
    assert eager["head_chain_cost_ratio_host"] > 0 and eager["head_chain_cost_ratio_device"] > 0
    assert eager["head_tree_cost_ratio_host"] > 0 and eager["head_tree_cost_ratio_device"] > 0
    assert eager["plain_follows_successor"] and eager["hf_eager"]["follows_successor"]
    assert eager["hf_eager"]["tokens_per_second"] > 0
    for run in eager["oracle_k4"].values():
        assert run["same_tokens_as_plain"] and run["predicted_speedup"] > 0 and 0 < run["alpha_measured"] <= 1
    for mode in ("eager", "kernels"):  # a server's rows drafting together: the pooled chain and forward, d(1) = 1
        pooled = report["modes"][mode]["pooled_draft"]
        assert pooled["rows"] == [1, 4, 16] and pooled["chain_d"]["1"] == pooled["forward_d"]["1"] == 1.0
        assert all(d > 0 for d in [*pooled["chain_d"].values(), *pooled["forward_d"].values(),
                                   *pooled["chain_cost_ratio_per_row"].values()])
    kernels = report["modes"]["kernels"]
    assert kernels["plain_follows_successor"] and kernels["chain_cost_ratio_device"] > 0
    assert all(run["same_tokens_as_plain"] for run in kernels["oracle_k4"].values())
    assert report["ratios"]["kernels_over_eager"]["plain_step"] > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_oracle_measures_the_stated_alpha(dtype):
    target, succ = successor_model("tiny-target", "cpu", dtype, 0)
    r = measure(target, succ, None, prompt(), 600, [0.5, 0.9], 4, repeats=1, profile_repeats=1, bandwidth_mb=8)
    assert r["plain_follows_successor"]
    for run in r["oracle_k4"].values():  # about 3 standard deviations of 600 tokens' estimate
        assert run["same_tokens_as_plain"]
        assert abs(run["alpha_measured"] - run["alpha_stated"]) < 0.06, run


def test_oracle_proposes_the_successor_chain_at_alpha_one_and_never_at_zero():
    succ = torch.randperm(512, generator=torch.Generator().manual_seed(3))
    state = DraftState(tokens=[5, 7], k=4, sampling=SamplingParams(), generator=None)
    chain = [7]
    for _ in range(4):
        chain.append(int(succ[chain[-1]]))
    assert OracleDrafter(succ, 1.0).propose(state).tokens.tolist() == chain[1:]
    drafted = OracleDrafter(succ, 0.0).propose(state).tokens.tolist()
    assert all(d != c for d, c in zip(drafted, chain[1:]))


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_successor_models_on_cuda_with_graphs():
    from specdec.model.cuda_graphs import enable_cuda_graphs
    for graphs in (False, True):
        target, succ = successor_model("tiny-target", "cuda", torch.bfloat16, 0)
        if graphs:
            enable_cuda_graphs(target)
        r = measure(target, succ, None, prompt(), 200, [0.8], 4, repeats=1, profile_repeats=1, bandwidth_mb=8)
        assert r["plain_follows_successor"] and r["oracle_k4"]["0.8"]["same_tokens_as_plain"]


def test_gpu_profile_script_runs_on_cpu(tmp_path):
    """scripts/gpu_profile.py's code on tiny shapes: both paths' operator tables (the Triton loop in the
    interpreter) and the attention's key-split sweep."""
    out = tmp_path / "profile.json"
    cmd = [sys.executable, str(ROOT / "scripts/gpu_profile.py"), "--device", "cpu", "--target", "tiny-target",
           "--context", "40", "--capacity", "128", "--sweep-contexts", "40,100", "--repeats", "2",
           "--bandwidth-mb", "8", "--top", "4", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=300,
                   env={**os.environ, "TRITON_INTERPRET": "1"})
    report = json.loads(out.read_text())
    for mode in ("torch", "kernels"):
        for step in ("decode", "verify5"):
            table = report["modes"][mode][step]
            assert table["step_us"] > 0 and 0 < table["roofline_share"] and len(table["top"]) == 4
    assert set(report["attention_split_us"]) == {"40", "100"}
    assert all(us > 0 for row in report["attention_split_us"].values() for us in row.values())


def test_the_gpu_scripts_name_bad_arguments(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    bench = ROOT / "scripts/cuda_bench.py"
    for modes, said in (("eager,bogus", "bogus"), ("graphs", "graphs need CUDA")):
        out = run(bench, "--device", "cpu", "--target", "tiny-target", "--draft", "tiny-draft", "--modes", modes,
                  "--out", tmp_path / "b.json")
        assert out.returncode != 0 and said in out.stderr and "Traceback" not in out.stderr, out.stderr
    for args, said in ((["--modes", "torch,bogus"], "bogus"), (["--device", "cuda"], "needs a GPU"),
                       (["--sweep-contexts", "512,lots"], "comma-separated token counts"),
                       (["--context", "5000"], "between 0 and --capacity")):
        if "cuda" in args and CUDA:
            continue
        out = run(ROOT / "scripts/gpu_profile.py", "--target", "tiny-target", *(["--device", "cpu"] if "--device"
                  not in args else []), *args, "--out", tmp_path / "p.json")
        assert out.returncode != 0 and said in out.stderr and "Traceback" not in out.stderr, out.stderr
    for args, said in ((["--tokenizer", tmp_path / "none"], "not a tokenizer directory"), ([], "give --tokenizer"),
                       (["--export-tokenizer", tmp_path / "none.gguf"], "none.gguf")):
        out = run(ROOT / "scripts/random_models.py", tmp_path / "m", *args)
        assert out.returncode != 0 and said in out.stderr and "Traceback" not in out.stderr, out.stderr
