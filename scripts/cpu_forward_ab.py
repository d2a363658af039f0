"""A decode step with the layer loop in C (cpu_forward.c) against the Python layer loop, alternated
in rounds on the same model and cache (context 512, the draft's way: logits of the last position,
with --head-rows its cut head too). Prints JSON.

Usage: python scripts/cpu_forward_ab.py [--model qwen2.5-coder-0.5b-instruct] [--weight-dtype auto] \
    [--head-rows 32768] [--rounds 9] >> runs/cpu-forward.jsonl
"""

import argparse
import json
import statistics
import time

import torch

from specdec.model import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--weight-dtype", default="auto")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--head-rows", type=int, default=0, help="score only the first N vocabulary rows (a draft's head)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round and loop (median)")
    args = ap.parse_args()
    model = load_model(args.model, weight_dtype=args.weight_dtype, progress=lambda *a: None).module
    if args.head_rows:
        from specdec.drafters.draft_model import truncated_head
        model = truncated_head(model, args.head_rows)
    fast = model.cpu_forward
    if fast is None:
        raise SystemExit(f"no C layer loop for {args.model} in {model.weight_format}")
    cache = model.new_cache(args.context + 8)
    tok = torch.tensor([[5]])
    times = {"c": [], "python": []}
    with torch.inference_mode():
        model(torch.randint(0, 1000, (1, args.context)), cache, 0)
        for r in range(args.rounds + 1):
            for key, loop in (("c", fast), ("python", None)):
                model.cpu_forward = loop
                ts = []
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    model(tok, cache, args.context, last_only=True)
                    ts.append(time.perf_counter() - t0)
                if r:  # the first round warms up
                    times[key].append(statistics.median(ts))
    model.cpu_forward = fast
    c, p = statistics.median(times["c"]), statistics.median(times["python"])
    print(json.dumps({"model": args.model, "weight_format": model.weight_format, "head_rows": args.head_rows,
                      "context": args.context, "threads": torch.get_num_threads(), "c_loop_ms": round(1e3 * c, 2),
                      "python_loop_ms": round(1e3 * p, 2), "python_over_c": round(p / c, 3),
                      "ratio_per_round": [round(b / a, 3) for a, b in zip(times["c"], times["python"])]}))


if __name__ == "__main__":
    main()
