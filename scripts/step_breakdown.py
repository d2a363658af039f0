"""Where a plain decode step's time goes: the whole step against its linear layers alone (one row
each, the same weights), for each --weight-dtype, alternated. Prints JSON.

Usage: python scripts/step_breakdown.py [--model qwen2.5-coder-1.5b-instruct] [--context 512] [--rounds 5] \
    > docs/results/step-breakdown-s13.json
"""

import argparse
import gc
import json
import statistics
import time

import torch

from specdec.model import load_model
from specdec.model.cpu_linear import PackedLinear


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="timed calls per round (median)")
    args = ap.parse_args()
    out = {"model": args.model, "context": args.context, "threads": torch.get_num_threads(), "weights": {}}
    for wd in ("float32", "bfloat16"):
        model = load_model(args.model, "cpu", weight_dtype=wd, pack=False, progress=lambda *a: None).module
        cache = model.new_cache(args.context + 8)
        model(torch.randint(0, 1000, (1, args.context)), cache, 0, last_only=True)
        cache.advance(args.context)
        token = torch.tensor([[42]])
        linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
        xs = {n: torch.randn(1, 1, n) for n in {m.weight.shape[1] for m in linears}}

        def step():
            model(token, cache, args.context)

        @torch.inference_mode()  # as in the forward: with grad on, a PackedLinear takes torch's path
        def gemms():
            for m in linears:
                m(xs[m.weight.shape[1]])

        def median_of(fn):
            fn()
            ts = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts)

        rounds = [(median_of(step), median_of(gemms)) for _ in range(args.rounds)]  # alternated
        step_s = statistics.median(r[0] for r in rounds)
        gemm_s = statistics.median(r[1] for r in rounds)
        nbytes = sum(m.weight.numel() * m.weight.element_size() for m in linears)
        out["weights"][wd] = {"step_seconds": round(step_s, 4), "linears_seconds": round(gemm_s, 4),
                              "outside_linears_seconds": round(step_s - gemm_s, 4),
                              "linear_weight_gb": round(nbytes / 1e9, 3),
                              "linears_gb_per_s": round(nbytes / gemm_s / 1e9, 2)}
        del model, cache, linears
        gc.collect()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
