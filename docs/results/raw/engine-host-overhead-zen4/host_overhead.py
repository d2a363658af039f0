"""The engine's host work a decode step: a tiny fp32 model's plain greedy decode through Engine.generate,
against the same number of bare one-token forwards, one thread; medians of 5 interleaved rounds.
    PYTHONPATH=. python docs/results/raw/engine-host-overhead-zen4/host_overhead.py"""
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, "tests")
from conftest import tiny_model  # noqa: E402
from specdec.config import GenerationConfig  # noqa: E402
from specdec.drafters.base import NoDrafter  # noqa: E402
from specdec.engine.engine import Engine  # noqa: E402

torch.set_num_threads(1)
N = 400
m = tiny_model(0, num_layers=1, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1)
engine, cfg, prompt = Engine.single(m, NoDrafter(), N + 8), GenerationConfig(N, 1, stop_at_eos=False), [1, 2, 3, 4]


def bare():
    cache, x = m.new_cache(N + 8), torch.tensor([[1]])
    for i in range(N):
        m(x, cache, i)


engine.generate(prompt, cfg)
bare()
eng, fwd = [], []
for _ in range(5):
    t0 = time.perf_counter(); engine.generate(prompt, cfg); eng.append((time.perf_counter() - t0) / N)
    t0 = time.perf_counter(); bare(); fwd.append((time.perf_counter() - t0) / N)
e, f = statistics.median(eng), statistics.median(fwd)
print(json.dumps({"engine_us_per_token": round(e * 1e6), "bare_forward_us_per_token": round(f * 1e6),
                  "host_work_us_per_step": round((e - f) * 1e6)}))
