"""The engine's host work a speculation step: Engine.generate with a draft model's device chain (the same
weights as the target: every draft accepted, k = 4) against the same forwards bare, one thread; medians of 7
interleaved rounds.
    PYTHONPATH=. python docs/results/raw/engine-host-overhead-zen4/spec_overhead.py"""
import json, statistics, sys, time
import torch
sys.path.insert(0, "tests")
from conftest import tiny_model
from specdec.config import GenerationConfig
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.device_chain import draft_chain, model_step
from specdec.engine.engine import Engine
torch.set_num_threads(1)
N, K = 400, 4
kw = dict(num_layers=1, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1)
m, d = tiny_model(0, **kw), tiny_model(0, **kw)
drafter = DraftModelDrafter(d, 96, N + 64, on_device=True)
engine = Engine.single(m, drafter, N + 64)
cfg = GenerationConfig(N, K, stop_at_eos=False)
steps = engine.generate([1, 2, 3, 4], cfg).stats.steps

def bare():
    tc, dc = m.new_cache(N + 64), d.new_cache(N + 64)
    pos = 4
    m(torch.tensor([[1, 2, 3, 4]]), tc, 0); d(torch.tensor([[1, 2, 3]]), dc, 0)
    samplings = (cfg.sampling,)
    for _ in range(steps):
        lg = d(torch.tensor([[1, 2]]), dc, pos - 2, last_only=True)[:, -1]
        draft_chain(model_step(d, dc, 96), lg, torch.tensor([pos]), None, K, samplings, False)
        m(torch.tensor([[1, 2, 3, 4, 5]]), tc, pos)
        pos += K + 1

eng, fwd = [], []
for _ in range(7):
    t0 = time.perf_counter(); engine.generate([1, 2, 3, 4], cfg); eng.append((time.perf_counter() - t0) / steps)
    t0 = time.perf_counter(); bare(); fwd.append((time.perf_counter() - t0) / steps)
e, f = statistics.median(eng), statistics.median(fwd)
print(json.dumps({"steps": steps, "engine_us_per_step": round(e * 1e6), "bare_us_per_step": round(f * 1e6),
                  "host_work_us_per_step": round((e - f) * 1e6)}))
