"""Weight formats for a whole decode step on this CPU: every matrix of Qwen2.5-1.5B's shape, each a
distinct tensor (6.2 GB in fp32, so nothing stays in the 300 MB L3), multiplied in turn by 1 or 5
rows, as a decode step (1) or a verify pass of k = 4 (5) reads them. Prints JSON.

Usage: python scripts/weight_stream_bench.py > docs/results/weight-stream.json

Formats: fp32 through MKL (the default); fp32 oneDNN-prepacked (our verify path); bf16 through
ATen (MKL/AMX); bf16 oneDNN-prepacked; weight-only int8 with per-row scales
(torch._weight_int8pack_mm, the kernel torch's CPU int8 weight-only quantization uses). Median
seconds of 5 passes over all matrices, and the effective read rate (weight bytes / seconds).
Unlike gemm_microbench.py (one layer re-read from cache), this is bound by memory as a real step is.
"""

import gc
import json
import time

import torch
import torch.nn.functional as F

LAYER = [(1536, 1536), (256, 1536), (256, 1536), (1536, 1536), (8960, 1536), (8960, 1536), (1536, 8960)]
SHAPES = LAYER * 28 + [(151936, 1536)]  # q k v o gate up down per layer, then the (tied) head


def timed(fn, weights, rows: int) -> float:
    xs = {n: torch.randn(1, rows, n) for n in (1536, 8960)}
    times = []
    for _ in range(6):
        t0 = time.perf_counter()
        for w, n in weights:
            fn(xs[n], w)
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[2]  # the first pass warms up


def run(name: str, make, fn, bytes_per_weight: float) -> dict:
    weights = [(make(torch.randn(a, b)), b) for a, b in SHAPES]
    nbytes = sum(a * b for a, b in SHAPES) * bytes_per_weight
    out = {}
    for rows in (1, 5):
        s = timed(fn, weights, rows)
        out[str(rows)] = {"seconds": round(s, 4), "gb_per_s": round(nbytes / s / 1e9, 2)}
    del weights
    gc.collect()
    return {"format": name, "weight_gb": round(nbytes / 1e9, 2), "rows": out}


def main() -> None:
    torch.manual_seed(0)
    bf = torch.bfloat16
    results = [
        run("fp32 MKL", lambda w: w, lambda x, w: F.linear(x, w), 4),
        run("fp32 oneDNN packed", lambda w: torch.ops.mkldnn._reorder_linear_weight(w, 5),
            lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""), 4),
        run("bf16 ATen", lambda w: w.to(bf), lambda x, w: F.linear(x.to(bf), w), 2),
        run("bf16 oneDNN packed", lambda w: torch.ops.mkldnn._reorder_linear_weight(w.to(bf), 5),
            lambda x, w: torch.ops.mkldnn._linear_pointwise(x.to(bf), w, None, "none", [], ""), 2),
        run("int8 weight-only (_weight_int8pack_mm)", int8_rowwise,
            lambda x, w: torch._weight_int8pack_mm(x.view(-1, x.shape[-1]), w[0], w[1]), 1),
    ]
    print(json.dumps({"threads": torch.get_num_threads(), "torch": torch.__version__, "results": results}, indent=1))


def int8_rowwise(w: torch.Tensor):
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127  # [out]
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale


if __name__ == "__main__":
    main()
