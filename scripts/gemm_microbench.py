"""CPU GEMM paths for few-row (verify) matmuls on one 1536x8960 layer; prints JSON.

Usage: python scripts/gemm_microbench.py > docs/results/gemm-microbench.json
Median milliseconds of 30 calls after warm-up. Produces the kernel table in docs/results/perf.md.
"""

import json
import time

import torch
import torch.nn.functional as F

HIDDEN, INTER = 1536, 8960


def median_ms(fn, reps: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(sorted(times)[reps // 2] * 1e3, 3)


def kernels(rows: int, w: torch.Tensor, wb: torch.Tensor) -> dict:
    x = torch.randn(1, rows, HIDDEN)
    xb = x.to(torch.bfloat16)
    packed32 = torch.ops.mkldnn._reorder_linear_weight(w, 5)
    packedbf = torch.ops.mkldnn._reorder_linear_weight(wb, rows)
    mkl_packed = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
    return {
        "mkl_fp32": median_ms(lambda: F.linear(x, w)),
        "onednn_packed_fp32": median_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed32, None, "none", [], "")),
        "bf16": median_ms(lambda: F.linear(xb, wb)),
        "onednn_packed_bf16": median_ms(lambda: torch.ops.mkldnn._linear_pointwise(xb, packedbf, None, "none", [], "")),
        "mkl_packed_fp32": median_ms(lambda: torch.ops.mkl._mkl_linear(x, mkl_packed, w, None, rows)),
    }


def fused_gate_up() -> dict:
    gate, up = torch.randn(INTER, HIDDEN), torch.randn(INTER, HIDDEN)
    both = torch.cat([gate, up])
    x = torch.randn(1, 1, HIDDEN)
    return {"separate": median_ms(lambda: (F.linear(x, gate), F.linear(x, up))),
            "fused": median_ms(lambda: F.linear(x, both))}


def main() -> None:
    torch.manual_seed(0)
    w = torch.randn(INTER, HIDDEN)
    wb = w.to(torch.bfloat16)
    result = {"layer": [INTER, HIDDEN], "threads": torch.get_num_threads(), "unit": "ms",
              "by_rows": {rows: kernels(rows, w, wb) for rows in (1, 2, 5, 9, 17, 33)},
              "gate_up_one_row": fused_gate_up()}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
