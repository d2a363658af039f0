"""Our skinny GEMM kernel (specdec/model/skinny_gemm.c) against torch's kernels, on a whole decode
step's worth of weights: every matrix of Qwen2.5-1.5B's shape, each a distinct tensor (6.2 GB fp32,
so nothing stays in the 300 MB L3), multiplied in turn by n input rows (n = 1: a decode step; n =
k + 1: a verify pass). Prints JSON.

Usage: python scripts/skinny_gemm_bench.py [--rounds 5] [--variants default,CHUNK_PANELS=4] > docs/results/skinny-gemm.json

Kernels: fp32 MKL (F.linear), fp32 oneDNN-prepacked (our verify path before), and ours (one
build per --variants entry: the default, or the source built with other -D settings).
Rounds interleave the kernels (this host's bandwidth drifts); the figure is the median of rounds.
Also times one 2 GB matrix (the profile's bandwidth probe) with MKL and with ours.
"""

import argparse
import gc
import json
import statistics
import time

import torch
import torch.nn.functional as F

from specdec.model import cpu_kernels

LAYER = [(1536, 1536), (256, 1536), (256, 1536), (1536, 1536), (8960, 1536), (8960, 1536), (1536, 8960)]
SHAPES = LAYER * 28 + [(151936, 1536)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", default="1,2,3,5,9,17")
    ap.add_argument("--variants", default="default",
                    help="builds to compare: 'default', or -D defines joined by '+' (e.g. PF_DIST=0+CHUNK_PANELS=4)")
    ap.add_argument("--no-packed", action="store_true", help="skip oneDNN (halves the memory)")
    ap.add_argument("--bf16", action="store_true",
                    help="also our kernel on bf16 copies of the weights (--weight-dtype bfloat16; half the bytes), "
                         "and torch's bf16 GEMM (F.linear on bf16 inputs)")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    torch.manual_seed(0)
    weights = [torch.randn(a, b) for a, b in SHAPES]
    nbytes = sum(a * b for a, b in SHAPES) * 4
    kernels = {"mkl": lambda x, w, p: F.linear(x, w)}
    packed = None
    if not args.no_packed:
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, 5) for w in weights]
        kernels["onednn_packed"] = lambda x, w, p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
    libs = {}
    for d in args.variants.split(","):
        libs[d] = cpu_kernels.load([] if d == "default" else [f"-D{x}" for x in d.split("+")])
        kernels[f"ours[{d}]"] = (lambda lib: lambda x, w, p: cpu_kernels.skinny_linear(x, w, None, lib=lib))(libs[d])
    half = [w.bfloat16() for w in weights] if args.bf16 else None
    if half:
        kernels["ours_bf16"] = lambda x, w, p: cpu_kernels.skinny_linear(x, w, None, lib=next(iter(libs.values())))
        kernels["torch_bf16"] = lambda x, w, p: F.linear(x.bfloat16(), w).float()
    xs = {n: {k: torch.randn(1, n, k) for k in (1536, 8960)} for n in rows}

    def one_pass(fn, n, name=""):
        x, ws = xs[n], half if name.endswith("bf16") else weights
        t0 = time.perf_counter()
        for i, w in enumerate(ws):
            fn(x[w.shape[1]], w, packed[i] if packed else None)
        return time.perf_counter() - t0

    times = {name: {n: [] for n in rows} for name in kernels}
    for name, fn in kernels.items():  # warm-up
        one_pass(fn, 1, name)
    for _ in range(args.rounds):
        for n in rows:
            for name, fn in kernels.items():
                if name == "mkl" and n > 3 and not args.no_packed:
                    continue  # MKL's multi-row path is known slow (gemm-microbench.json); save time
                times[name][n].append(one_pass(fn, n, name))
    table = {name: {str(n): {"seconds": round(statistics.median(t), 4),
                             "gb_per_s": round(nbytes / (2 if name.endswith("bf16") else 1)
                                               / statistics.median(t) / 1e9, 2),
                             "vs_1_row": round(statistics.median(t) / statistics.median(times[name][1]), 3)}
                    for n, t in per.items() if t}
             for name, per in times.items()}
    del packed, weights, half
    gc.collect()

    big = torch.ones(2048 * (1 << 20) // 4 // 4096, 4096)  # the profile's probe: 2 GB, one matrix
    v = torch.ones(1, 4096)
    probe = {"mkl": lambda: F.linear(v, big)}
    for d, lib in libs.items():
        probe[f"ours[{d}]"] = (lambda lib: lambda: cpu_kernels.skinny_linear(v, big, None, lib=lib))(lib)
    bw = {name: [] for name in probe}
    for _ in range(2 * args.rounds + 1):
        for name, fn in probe.items():
            t0 = time.perf_counter()
            fn()
            bw[name].append(big.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    print(json.dumps({"threads": torch.get_num_threads(), "torch": torch.__version__, "weight_gb": round(nbytes / 1e9, 2),
                      "step_weights": table,
                      "probe_2gb_gb_per_s": {k: round(statistics.median(b), 2) for k, b in bw.items()}}, indent=1))


if __name__ == "__main__":
    main()
