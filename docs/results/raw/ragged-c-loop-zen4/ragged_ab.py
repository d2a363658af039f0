"""A ragged forward (a server's batched verify or pooled draft position: B cache rows at their own slots, T new
tokens each) against one sequence's one-token step, for the 1.5B target and the 0.5B draft as serve loads them;
medians of 11 after a warm-up, one process per checkout. Run by
    for tree in BEFORE AFTER BEFORE AFTER; do TREE=$tree python ragged_ab.py; done"""
import json, os, statistics, sys, time
import torch
sys.path.insert(0, os.environ["TREE"])
from specdec.engine.build import Builder
from specdec.sampling.verify import ragged_inputs
from specdec.settings import DraftingSettings, ModelSettings

b, m = Builder.from_settings(ModelSettings(model="qwen2.5-coder-1.5b-instruct"),
                             DraftingSettings(draft="qwen2.5-coder-0.5b-instruct"), lambda s: None)
models = {"target": b.target.module, "draft": b.drafter(m, None).cost_model()}


def ms(fn, n=11):
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return round(1e3 * statistics.median(times), 2)


out = {"tree": os.environ["TREE"]}
with torch.inference_mode():
    for name, mod in models.items():
        cache, one = mod.new_cache(1024, batch=16), mod.new_cache(1024)
        one.advance(300)
        out[f"{name} one sequence, 1 token"] = ms(lambda: mod(torch.tensor([[5]]), one, 300))
        for rows, t in ((1, 1), (4, 1), (4, 5), (16, 1), (16, 5)):
            tokens, slots, positions, mask = ragged_inputs([300 + 7 * i for i in range(rows)], [[5] * t] * rows, "cpu")
            at = torch.arange(rows)
            out[f"{name} ragged {rows} rows x {t}"] = ms(
                lambda: mod(tokens, cache, 0, positions=positions, mask=mask, slots=slots, rows=at))
print(json.dumps(out))
