"""Logits at every position of N tokens of real text (teacher-forced), saved for comparison across builds."""
import json, sys, torch
from pathlib import Path
from specdec.model import load_model, cpu_kernels
N, out, model = int(sys.argv[1]), sys.argv[2], (sys.argv[3] if len(sys.argv) > 3 else "qwen2.5-coder-1.5b-instruct")
Q = Path(__file__).resolve().parents[5] / "shared" / "data" / "spec_bench" / "question.jsonl"
lm = load_model(model, progress=lambda *a: None)
text = "\n".join(t for line in Q.read_text().splitlines() for t in json.loads(line)["turns"])
ids = lm.tokenizer.encode(text)[:N]
cache = lm.module.new_cache(N + 1)
with torch.inference_mode():
    logits = lm.module(torch.tensor([ids]), cache, 0, last_only=False)[0].float()
torch.save({"ids": ids, "logits": logits.half(), "precision": getattr(cpu_kernels, "attention_precision", lambda: "fp32")()}, out)
print(out, getattr(cpu_kernels, "attention_precision", lambda: "fp32")())
