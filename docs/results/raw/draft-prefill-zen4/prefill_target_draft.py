import sys, time, torch
from specdec.model import load_model
n = int(sys.argv[1]) if len(sys.argv) > 1 else 256
t = load_model("qwen2.5-coder-1.5b-instruct", progress=lambda *a: None)
d = load_model("qwen2.5-coder-0.5b-instruct", draft=True, progress=lambda *a: None, beside=t)
ids = torch.randint(100, 20000, (1, n))
for name, m in (("target", t.module), ("draft", d.module)) * 1:
    pass
def run(m):
    c = m.new_cache(4096)
    t0 = time.perf_counter()
    m(ids, c, 0, last_only=True)
    return time.perf_counter() - t0
res = {"target": [], "draft": []}
for r in range(4):
    for name, m in (("target", t.module), ("draft", d.module)):
        res[name].append(run(m))
import statistics
for k, v in res.items():
    med = statistics.median(v[1:])
    print(k, n, f"{med*1000:.1f} ms", f"{n/med:.0f} tok/s", [round(x*1000) for x in v])
print("ratio draft/target", statistics.median(res["draft"][1:]) / statistics.median(res["target"][1:]))
