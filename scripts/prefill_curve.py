"""The draft model's prefill time against prompt length, and the target's forward time at 1, 2 and
5 positions, in plain steps of the target (context 512). Prints JSON.

Backs the affine prefill price (policy.CostModel.prefill: a fixed part per forward plus a part per
token) and a check of the verify curve outside `specdec profile`: the target's forwards are
alternated round by round, so that the host's drift hits every size alike.

Usage: python scripts/prefill_curve.py [--lengths 8,16,32,64,128,256,512,768] [--rounds 7] > runs/prefill-curve.json
"""

import argparse
import json
import statistics
import time

from specdec.bench.profile import forward_fn, forward_seconds
from specdec.model import load_model
from specdec.policy import fit_prefill


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--lengths", default="8,16,32,64,128,256,512,768")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    target = load_model(args.model, progress=lambda *a: None).module
    draft = load_model(args.draft, progress=lambda *a: None).module
    fns = {n: forward_fn(target, n, 512) for n in (1, 2, 5)}
    for fn in fns.values():  # warm-up
        fn()
    times = {n: [] for n in fns}
    for _ in range(args.rounds):
        for n, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[n].append(time.perf_counter() - t0)
    t = {n: statistics.median(ts) for n, ts in times.items()}
    prefill = {n: forward_seconds(draft, n, 0, 3, last_only=True) / t[1] for n in map(int, args.lengths.split(","))}
    fixed, per_token = fit_prefill((64, prefill[64]), (512, prefill[512])) if {64, 512} <= prefill.keys() else (None, None)
    print(json.dumps({"target": args.model, "draft": args.draft, "context": 512, "rounds": args.rounds,
                      "target_forward_seconds": {str(n): round(s, 4) for n, s in t.items()},
                      "verify_cost": {str(n): round(s / t[1], 3) for n, s in t.items()},
                      "draft_prefill_plain_steps": {str(n): round(s, 3) for n, s in prefill.items()},
                      "fit_64_512": {"fixed": fixed and round(fixed, 3), "per_token": per_token and round(per_token, 5)}},
                     indent=1))


if __name__ == "__main__":
    main()
