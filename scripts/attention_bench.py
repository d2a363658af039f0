"""CPU attention alone (`cpu_kernels.attend`, one layer of Qwen2.5-1.5B's shape: 12 query heads, 2 kv
heads, 128 dims) on random data: a causal prefill of S positions from slot 0, and T = 1, 5, 9
positions (a decode step, verify passes) after S - T cached slots, at each context S. Prints JSON:
milliseconds per layer (the best of the prefill's rounds, the median of the short passes') and the
prefill's GFLOP/s. Run it from two checkouts (PYTHONPATH) to compare kernels.

Usage: python scripts/attention_bench.py [--contexts 512,2048,4096] [--rounds 2] > runs/attention.json
"""

import argparse
import json
import statistics
import time

import torch

from specdec.model import cpu_kernels
from specdec.model.transformer import causal_mask

H, KV, D = 12, 2, 128


def seconds(q, k, v, S, mask) -> float:
    t0 = time.perf_counter()
    cpu_kernels.attend(q, k, v, S, H, None, mask)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="512,2048,4096")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each prefill (the best is kept)")
    ap.add_argument("--passes", type=int, default=200, help="repeats of each short pass (the median is kept)")
    args = ap.parse_args()
    torch.manual_seed(0)
    out = {"shape": {"heads": H, "kv_heads": KV, "head_dim": D}, "threads": torch.get_num_threads(), "contexts": {}}
    for S in (int(x) for x in args.contexts.split(",")):
        k, v = torch.randn(1, KV, S, D), torch.randn(1, KV, S, D)
        q = torch.randn(1, S, (H + 2 * KV) * D)
        best = min(seconds(q, k, v, S, causal_mask(0, S, "cpu")) for _ in range(args.rounds))
        row = {"prefill_ms": round(best * 1e3, 2), "prefill_gflops": round(4 * H * D * S * (S + 1) / 2 / best / 1e9, 1)}
        for T in (1, 5, 9):
            qt, mask = q[:, :T].contiguous(), causal_mask(S - T, T, "cpu") if T > 1 else None
            row[f"T{T}_ms"] = round(statistics.median(seconds(qt, k, v, S, mask) for _ in range(args.passes)) * 1e3, 4)
        out["contexts"][S] = row
        print(json.dumps({S: row}), flush=True, file=__import__("sys").stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
