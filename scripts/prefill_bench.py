"""Prefill time per prompt length and the process's peak memory, for one --weight-dtype (one model
loaded per process, so the peak RSS is that mode's). Prints JSON.

Usage: python scripts/prefill_bench.py [--model qwen2.5-coder-1.5b-instruct] [--weight-dtype auto] \
    [--lengths 16,64,256,512] [--rounds 2] >> runs/prefill.jsonl
"""

import argparse
import json
import resource

import torch

from specdec.bench.profile import forward_seconds
from specdec.model import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--weight-dtype", default="auto")
    ap.add_argument("--lengths", default="16,64,256,512")
    ap.add_argument("--rounds", type=int, default=2, help="timed prefills per length (median; one more warms up)")
    args = ap.parse_args()
    loaded = load_model(args.model, weight_dtype=args.weight_dtype, progress=lambda *a: None)
    model = loaded.module
    out = {"model": args.model, "weight_dtype": args.weight_dtype, "weight_format": model.weight_format,
           "threads": torch.get_num_threads(), "prefill": {}}
    with torch.inference_mode():
        for n in (int(x) for x in args.lengths.split(",")):
            t = forward_seconds(model, n, 0, args.rounds, last_only=True)
            out["prefill"][str(n)] = {"seconds": round(t, 4), "ms_per_token": round(1e3 * t / n, 2)}
    out["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)  # KiB -> GB
    print(json.dumps(out))


if __name__ == "__main__":
    main()
