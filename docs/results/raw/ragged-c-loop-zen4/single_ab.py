"""One sequence's one-token step of the 0.5B draft (generate's path through the C layer loop) in two checkouts:
the median of 600 steps at 300 cached positions after 10 warm-up steps, one process per checkout. Run by
    for i in 1 2 3 4; do for tree in BEFORE AFTER; do TREE=$tree python single_ab.py; done; done"""
import json, os, statistics, sys, time
import torch
sys.path.insert(0, os.environ["TREE"])
from specdec.engine.build import Builder
from specdec.settings import DraftingSettings, ModelSettings

b, m = Builder.from_settings(ModelSettings(model="qwen2.5-coder-1.5b-instruct"),
                             DraftingSettings(draft="qwen2.5-coder-0.5b-instruct"), lambda s: None)
draft = b.drafter(m, None).cost_model()
with torch.inference_mode():
    cache, x = draft.new_cache(1024), torch.tensor([[5]])
    cache.advance(300)
    for _ in range(10):
        draft(x, cache, 300, last_only=True)
    times = []
    for _ in range(600):
        t0 = time.perf_counter(); draft(x, cache, 300, last_only=True); times.append(time.perf_counter() - t0)
print(json.dumps({"tree": os.environ["TREE"], "draft_step_ms": round(1e3 * statistics.median(times), 3)}))
