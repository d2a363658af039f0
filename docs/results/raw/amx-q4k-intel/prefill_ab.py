import json, statistics, sys, time
sys.path.insert(0, "scripts")
import torch
from prefill_vs_llama import prompt_tokens, ours_seconds
from specdec.model import load_model, cpu_kernels
lm = load_model("qwen2.5-coder-1.5b-instruct", progress=lambda *a: None)
lib = cpu_kernels._lib
out = {}
for n in (16, 64, 128, 512, 2048):
    ids = prompt_tokens(lm.tokenizer, n)
    lib.quant_amx_enable(1); ours_seconds(lm.module, ids[:32]); lib.quant_amx_enable(0); ours_seconds(lm.module, ids[:32])
    t = {0: [], 1: []}
    for r in range(5 if n <= 512 else 3):
        for on in ((1, 0) if r % 2 == 0 else (0, 1)):
            assert lib.quant_amx_enable(on) == on
            t[on].append(ours_seconds(lm.module, ids))
    ratio = statistics.median(a / b for a, b in zip(t[0], t[1]))
    out[n] = {"amx_tok_s": round(n / statistics.median(t[1]), 1), "vnni_tok_s": round(n / statistics.median(t[0]), 1),
              "amx_speedup": round(ratio, 3)}
    print(n, out[n], flush=True)
# the bits: prefill logits equal with and without
ids = prompt_tokens(lm.tokenizer, 300)
res = []
for on in (1, 0):
    lib.quant_amx_enable(on)
    cache = lm.module.new_cache(301)
    with torch.inference_mode():
        res.append(lm.module(torch.tensor([ids]), cache, 0))
print("same logits:", torch.equal(res[0], res[1]))
