"""Ours on a GGUF file in one process: prefill of 512 random tokens, 64 decode steps after it (median step),
and verify forwards of n rows against that step (v(n), medians of 7). Prints JSON.
Usage: SPECDEC_HOME=... python speed.py FILE"""
import json
import statistics
import sys
import time

import torch

from specdec.model import load_model

torch.set_num_threads(2)
m = load_model(sys.argv[1], device="cpu", progress=lambda *a, **k: None).module
g = torch.Generator().manual_seed(0)
vocab = m.config.vocab_size
out = {"layer_loop": m.layer_loop is not None}
with torch.inference_mode():
    c = m.new_cache(1024)
    t0 = time.perf_counter()
    m(torch.randint(0, vocab, (1, 512), generator=g), c, 0)
    out["prefill_tok_s"] = round(512 / (time.perf_counter() - t0), 1)
    steps = []
    for i in range(64):
        x = torch.randint(0, vocab, (1, 1), generator=g)
        t0 = time.perf_counter()
        m(x, c, 512 + i)
        steps.append(time.perf_counter() - t0)
    one = statistics.median(steps)
    out["decode_tok_s"] = round(1 / one, 2)
    v = {}
    for n in (2, 3, 5, 9):
        x = torch.randint(0, vocab, (1, n), generator=g)
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            m(x, c, 576)
            times.append(time.perf_counter() - t0)
        v[n] = round(statistics.median(times) / one, 2)
    out["v"] = v
print(json.dumps(out))
