import sys, time, statistics, torch
sys.path.insert(0, '.')
from specdec.model import load_model
q = lambda *a: None
m = {b: load_model("qwen2.5-coder-0.5b-instruct", draft=True, draft_bits=b, progress=q, head_rows=32768).module for b in (4, 3)}
torch.manual_seed(0)
ids = torch.randint(0, 30000, (1, 256))
res = {4: [], 3: []}
with torch.inference_mode():
    caches = {}
    for b, mod in m.items():
        caches[b] = mod.new_cache(1024)
        mod(ids, caches[b], 0)
    for r in range(6):
        for b in ((4, 3) if r % 2 == 0 else (3, 4)):
            mod, cache = m[b], caches[b]
            tok = torch.tensor([[5]])
            t0 = time.perf_counter()
            for i in range(100):
                mod(tok, cache, 256 + i, last_only=True)
            res[b].append((time.perf_counter() - t0) / 100 * 1e3)
for b in (4, 3):
    print(b, "median ms", round(statistics.median(res[b]), 3), [round(x, 2) for x in res[b]])
print("ratio 3/4", round(statistics.median(res[3]) / statistics.median(res[4]), 3))
