import sys, time, statistics, torch
from specdec.model import load_model
n = int(sys.argv[1])
t = load_model("qwen2.5-coder-1.5b-instruct", progress=lambda *a: None)
ms = {b: load_model("qwen2.5-coder-0.5b-instruct", draft=True, draft_bits=b, progress=lambda *a: None, beside=t).module for b in (3, 4)}
ids = torch.randint(100, 20000, (1, n))
res = {3: [], 4: []}
for r in range(6):
    for b, m in ms.items():
        c = m.new_cache(4096)
        t0 = time.perf_counter(); m(ids, c, 0, last_only=True); res[b].append(time.perf_counter() - t0)
for b, v in res.items():
    print(b, n, f"{statistics.median(v[1:])*1000:.1f} ms")
print("3/4", statistics.median(res[3][1:]) / statistics.median(res[4][1:]))
