"""The draft model's prefill with and without its oneDNN-packed weight copy (pack=True / False in
load_model): the median of 3 timed forwards over 64 and 256 prompt tokens (after one warm-up).
Prints a dict of seconds.

Usage: python scripts/draft_prefill_pack.py > docs/results/draft-prefill-pack-s14.txt
"""

import statistics
import time

import torch

from specdec.model import load_model
res = {}
for pack in (False, True):
    m = load_model("qwen2.5-coder-0.5b-instruct", progress=lambda *a: None, pack=pack).module
    for n in (64, 256):
        x = torch.randint(0, 1000, (1, n))
        ts = []
        with torch.inference_mode():
            for _ in range(4):
                c = m.new_cache(n + 8)
                t0 = time.perf_counter(); m(x, c, 0, last_only=True); ts.append(time.perf_counter() - t0)
        res[(pack, n)] = statistics.median(ts[1:])
    del m
print({f"pack={p} n={n}": round(v, 3) for (p, n), v in res.items()})
