import statistics, time
import torch
from specdec.model import load_model, cpu_kernels
lm = load_model("qwen2.5-coder-1.5b-instruct", progress=lambda *a: None)
lib, m = cpu_kernels._lib, lm.module
ctx = 512
cache = m.new_cache(ctx + 40); cache.advance(ctx)
def run(n):
    x = torch.randint(0, 1000, (1, n))
    t0 = time.perf_counter()
    m(x, cache, ctx, last_only=False)
    return time.perf_counter() - t0
for n in (5, 8, 9, 12, 16):
    t = {0: [], 1: []}
    for r in range(12):
        for on in ((1, 0) if r % 2 == 0 else (0, 1)):
            lib.quant_amx_enable(on); t[on].append(run(n))
    print(n, "vnni ms", round(1000*statistics.median(t[0][2:]),1), "amx ms", round(1000*statistics.median(t[1][2:]),1),
          "vnni/amx", round(statistics.median(a/b for a, b in zip(t[0][2:], t[1][2:])), 3), flush=True)
