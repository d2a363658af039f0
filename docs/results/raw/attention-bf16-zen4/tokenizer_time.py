"""The target's tokenizer built from its GGUF metadata, twice in one process (seconds)."""
import time
from specdec.model.registry import pull
import specdec.model.tokenizer as tk
p = pull("qwen2.5-coder-1.5b-instruct")
for _ in range(2):
    t = time.perf_counter()
    tk.load_tokenizer(str(p))
    print(f"tokenizer {time.perf_counter() - t:.3f} s")
