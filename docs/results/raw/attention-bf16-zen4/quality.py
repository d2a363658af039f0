"""Teacher-forced: the 1.5B over N tokens of real text, logits at every position, with attention's
q.k (and optionally p.v) rounded to low precision, against our fp32 attention. Prints top-1 agreement
and mean KL(fp32 || low)."""
import json, sys, time, torch
from pathlib import Path
from specdec.model import load_model, cpu_kernels
from specdec.model import transformer

N = int(sys.argv[1]); modes = sys.argv[2].split(",")
Q = Path(__file__).resolve().parents[5] / "shared" / "data" / "spec_bench" / "question.jsonl"
lm = load_model("qwen2.5-coder-1.5b-instruct", progress=lambda *a: None)
text = "\n".join(t for line in Q.read_text().splitlines() for t in json.loads(line)["turns"])
ids = lm.tokenizer.encode(text)[:N]
real = cpu_kernels.attend

def rnd(x, how):
    if how == "bf16":
        return x.bfloat16().float()
    if how == "int8":
        s = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 127
        return (x / s).round().clamp(-127, 127) * s
    return x

def make(qk, pv, smooth):
    def attend(q, k_cache, v_cache, slots, heads, rows=None, mask=None, scale=None, lib=None):
        B, T = q.shape[:2]; _, kv, cap, D = k_cache.shape
        qq = q[:, :, :heads * D].reshape(B, T, heads, D).transpose(1, 2)  # B H T D
        k = k_cache[:B, :, :slots]; v = v_cache[:B, :, :slots]
        if smooth == "first":
            k = k - k[:, :, :1]
        elif smooth == "mean":
            k = k - k.mean(2, keepdim=True)
        g = heads // kv
        k = rnd(k, qk).repeat_interleave(g, 1); v = rnd(v, pv).repeat_interleave(g, 1)
        s = rnd(qq, qk) @ k.transpose(-1, -2) * (scale if scale is not None else D ** -0.5)
        if mask is not None:
            m = mask[..., :slots] if mask.dim() == 2 else mask[:, 0, :, :slots].unsqueeze(1)
            s = s.masked_fill(~m, float("-inf"))
        p = torch.softmax(s, -1)
        o = rnd(p, pv) @ v
        return o.transpose(1, 2).reshape(B, T, heads * D)
    return attend

def run(fn):
    cpu_kernels.attend = fn
    transformer.cpu_kernels.attend = fn
    cache = lm.module.new_cache(N + 1)
    t0 = time.time()
    with torch.inference_mode():
        out = lm.module(torch.tensor([ids]), cache, 0, last_only=False)[0].float()
    return out, time.time() - t0

ref, t = run(real)
lref = torch.log_softmax(ref, -1)
print(json.dumps({"mode": "fp32 (ours)", "n": N, "s": round(t, 1)}), flush=True)
for mode in modes:
    qk, pv, smooth = (mode.split(":") + ["", ""])[:3]
    out, t = run(make(qk, pv, smooth))
    l = torch.log_softmax(out, -1)
    agree = (out.argmax(-1) == ref.argmax(-1)).float()
    kl = (lref.exp() * (lref - l)).sum(-1)
    print(json.dumps({"mode": mode, "agree": round(agree.mean().item(), 4),
                      "agree_last_quarter": round(agree[3 * N // 4:].mean().item(), 4),
                      "kl_mean": round(kl.mean().item(), 5), "kl_p99": round(kl.quantile(0.99).item(), 4),
                      "s": round(t, 1)}), flush=True)
