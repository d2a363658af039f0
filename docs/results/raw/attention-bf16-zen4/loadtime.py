import time
t0 = time.perf_counter()
import torch
from specdec.model import load_model
t1 = time.perf_counter()
tg = load_model("qwen2.5-coder-1.5b-instruct", progress=lambda *a: None)
t2 = time.perf_counter()
dr = load_model("qwen2.5-coder-0.5b-instruct", progress=lambda *a: None, draft=True, beside=tg, head_rows=32768)
t3 = time.perf_counter()
print(f"imports {t1-t0:.2f}  target {t2-t1:.2f}  draft {t3-t2:.2f}")
