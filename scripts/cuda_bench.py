"""The CUDA path measured: `specdec profile`'s numbers (bandwidth roofline, plain step, v(n), c) and
end-to-end decode speed in bf16, in each mode: eager, CUDA graphs, and the Triton layer loop
(gpu_forward.py, --gpu-kernels) with graphs and without; HF transformers' eager decode on the same
weights beside the eager mode, and (--hf-compile) its static cache with the forward compiled.

The GGUFs cannot travel to the GPU machine here (the working tree it receives is capped at 64 MiB),
so the models are random weights in the exact Qwen2.5-Coder 1.5B and 0.5B shapes, built so that the
greedy next token is a fixed permutation of the current one by a margin wider than bf16's rounding
(specdec/bench/synthetic.py): speed does not depend on the weights' values, acceptance does.
End-to-end speculation uses an oracle drafter proposing that continuation with each token kept with
probability alpha, at zero draft cost: it measures the verify side at a known acceptance, and reports
the measured alpha beside the stated one, and the speedup predicted from it and v(k+1) beside the
measured one. The draft model's cost enters through c, measured separately, and for a server's rows
drafting together through d(B), a pooled chain and a ragged forward of B rows against one row's.

    PYTHONPATH=. python3 scripts/cuda_bench.py --out runs/cuda-bench.json [--modes kernels+graphs,graphs,eager]
        [--hf-compile] [--compile reduce-overhead]
    PYTHONPATH=. python3 scripts/cuda_bench.py --device cpu --target tiny-target --draft tiny-draft --out /tmp/b.json
"""

from __future__ import annotations

import argparse
import json

import torch

from specdec.bench.synthetic import (SHAPES, compiled_step, follows, hf_decode_rate, hf_static_compiled_rate, measure,
                                     successor_model)
from specdec.model import gpu_forward
from specdec.model.cuda_graphs import enable_cuda_graphs


MODES = ("eager", "graphs", "kernels+graphs", "kernels")  # kernels: gpu_forward.py's Triton layer loop


def run_mode(args, mode: str, dtype: torch.dtype) -> dict:
    target, succ = successor_model(args.target, args.device, dtype, 0)
    draft, _ = successor_model(args.draft, args.device, dtype, 1)
    for model in (target, draft):
        if mode.startswith("kernels"):
            gpu_forward.enable(model)
        if mode.endswith("graphs"):
            enable_cuda_graphs(model)
    vocab = target.config.vocab_size
    prompt = torch.randint(0, vocab, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    alphas = [float(a) for a in args.alphas.split(",")]
    prof = measure(target, succ, draft, prompt, args.new_tokens, alphas, args.k, args.repeats,
                   args.profile_repeats, args.bandwidth_mb)
    if target.graphs is not None:
        prof["graph_captures"] = target.graphs.captures
    if mode == "eager" and not args.no_hf:  # HF transformers' eager generate() on the same weights, beside ours
        hf = hf_decode_rate(target, prompt, args.new_tokens, args.repeats)
        prof["hf_eager"] = {"tokens_per_second": hf["tokens_per_second"],
                            "follows_successor": follows(succ, prompt, hf["tokens"])}
    return prof


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b", choices=sorted(SHAPES))
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=129)
    ap.add_argument("--alphas", default="0.6,0.8,0.95")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile-repeats", type=int, default=15)
    ap.add_argument("--bandwidth-mb", type=int, default=2048, help="the roofline probe's buffer")
    ap.add_argument("--modes", default=None,
                    help=f"which of {', '.join(MODES)} to run, in this order, each written as it ends; none: only "
                         "--compile's step (default: "
                         "kernels+graphs,graphs,eager on CUDA, eager on a CPU, where kernels runs under "
                         "TRITON_INTERPRET=1)")
    ap.add_argument("--no-hf", action="store_true", help="skip HF transformers' eager decode on the same weights")
    ap.add_argument("--hf-compile", action="store_true", help="also time HF transformers' generate() with its "
                    "static cache, which torch.compiles its forward (after the modes, before --compile)")
    ap.add_argument("--compile", default="", help="also time the plain step through torch.compile in this mode "
                    "(e.g. reduce-overhead, max-autotune-no-cudagraphs), after the other modes")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("cuda_bench: no CUDA device here; --device cpu runs the same code on the CPU")
    report = {"device": torch.cuda.get_device_name() if cuda else args.device, "torch": torch.__version__,
              "dtype": str(dtype), "target": args.target, "draft": args.draft, "context": args.context,
              "k": args.k, "modes": {}}
    modes = (args.modes or ("kernels+graphs,graphs,eager" if cuda else "eager")).split(",")
    modes = [] if modes == ["none"] else modes  # --modes none: Inductor's step alone (--compile)
    if bad := [m for m in modes if m not in MODES or (not cuda and m.endswith("graphs"))]:
        raise SystemExit(f"cuda_bench: unknown mode(s) {bad} for {args.device} (modes: {', '.join(MODES)}; "
                         "graphs need CUDA)")
    for mode in modes:
        prof = run_mode(args, mode, dtype)
        report["modes"][mode] = prof
        print(mode, json.dumps({k: v for k, v in prof.items() if k != "roofline_rounds"}), flush=True)
        write(args.out, report)  # each mode as it ends: a run cut short keeps what it measured
        if cuda:
            torch.cuda.empty_cache()
    if args.hf_compile:  # HF transformers' static cache, compiled: before ours, which may take longer
        target, succ = successor_model(args.target, args.device, dtype, 0)
        prompt = torch.randint(0, target.config.vocab_size, (args.context,),
                               generator=torch.Generator().manual_seed(0)).tolist()
        try:
            hf = hf_static_compiled_rate(target, prompt, args.new_tokens, args.repeats)
            report["hf_static_compiled"] = {**{k: v for k, v in hf.items() if k != "tokens"},
                                            "follows_successor": follows(succ, prompt, hf["tokens"])}
        except Exception as e:  # a bench reports what failed and writes what it measured
            report["hf_static_compiled"] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
        print("hf_static_compiled", json.dumps(report["hf_static_compiled"]), flush=True)
        write(args.out, report)
    if args.compile:  # last: Inductor may take minutes
        target, _ = successor_model(args.target, args.device, dtype, 0)
        try:
            report["compiled"] = compiled_step(target, args.context, args.profile_repeats, args.compile)
        except Exception as e:  # a bench reports what failed and writes what it measured
            report["compiled"] = {"mode": args.compile, "error": f"{type(e).__name__}: {str(e)[:500]}"}
        print("compiled", json.dumps(report["compiled"]), flush=True)
    report["ratios"] = ratios(report)
    print(json.dumps(report["ratios"]))
    write(args.out, report)


def ratios(report: dict) -> dict:
    """Each mode's plain step and decode rate over eager's and over graphs', where both ran: how much
    faster than the baseline (and Inductor's compiled step over each mode's)."""
    modes, out = report["modes"], {}
    for base in ("eager", "graphs"):
        for name, m in modes.items():
            if base in modes and name != base:
                b = modes[base]
                out[f"{name}_over_{base}"] = {
                    "plain_step": round(b["step_seconds"] / m["step_seconds"], 3),
                    "plain_decode": round(m["plain_decode_tokens_per_second"] / b["plain_decode_tokens_per_second"], 3)}
    if "step_seconds" in report.get("compiled", {}):
        for name, m in modes.items():
            out[f"compiled_step_over_{name}_step"] = round(m["step_seconds"] / report["compiled"]["step_seconds"], 3)
    return out


def write(path: str, report: dict) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
