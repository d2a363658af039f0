"""What processing a row's logits costs: the sampler (probs_from_logits) on 40 real rows of the 1.5B
target's logits (a chat answer in progress), against the whole-vocabulary sort it replaced, and a
request's penalties (Penalties.rows + apply) with a 2,000-token prompt and a 400-token answer;
medians of 20 calls, one and five rows.
    SPECDEC_HOME=... PYTHONPATH=. python docs/results/raw/sampler-zen4/sampling_cost.py"""
import json, random, statistics, time
import torch
from specdec.config import SamplingParams
from specdec.model import load_model
from specdec.model.tokenizer import encode_messages
from specdec.sampling import logits as L
from specdec.sampling.penalties import Penalties


def sorted_top_p(logits, top_p):  # the former _top_p_mask: softmax, a full sort, a cumsum
    p, order = torch.softmax(logits, -1).sort(dim=-1, descending=True)
    keep = torch.zeros_like(p, dtype=torch.bool).scatter_(-1, order, p.cumsum(-1) - p < top_p)
    return logits.masked_fill(~keep, float("-inf"))


def old_probs(x, s):  # probs_from_logits before: every mask over the whole vocabulary
    x = x.float() / s.temperature
    if s.min_p > 0: x = L._min_p_mask(x, s.min_p)
    if s.top_k > 0: x = L._top_k_mask(x, s.top_k)
    if s.top_p < 1: x = sorted_top_p(x, s.top_p)
    return torch.softmax(x, -1)


def ms(f, n=20):
    f()
    out = []
    for _ in range(n):
        t = time.perf_counter(); f(); out.append(time.perf_counter() - t)
    return round(statistics.median(out) * 1e3, 3)


torch.set_num_threads(2)
m = load_model("qwen2.5-coder-1.5b-instruct")
tok = m.tokenizer
ids = encode_messages(tok, [{"role": "user", "content": "Explain what a hash map is, in a few sentences."}])
ids += tok.encode("A hash map is a data structure that stores key-value pairs and lets you look up a value by its key in",
                  add_special_tokens=False)
with torch.inference_mode():
    real = m.module(torch.tensor([ids]), m.module.new_cache(len(ids) + 1), 0)[0, -40:].float()
out = {"sampler": {}, "penalties": {}}
for name, s in {"T0.7 top-p 0.95": SamplingParams(0.7, 0, 0.95),
                "T0.8 top-k 40 top-p 0.95 min-p 0.05": SamplingParams(0.8, 40, 0.95, None, 0.05)}.items():
    for rows in (1, 5):
        x = real[:rows]
        out["sampler"][f"{name}, {rows} row(s)"] = {"sorted_ms": ms(lambda: old_probs(x, s)),
                                                     "now_ms": ms(lambda: L.probs_from_logits(x, s))}
rng = random.Random(0)
prompt, answer = [rng.randrange(151936) for _ in range(2000)], [rng.randrange(151936) for _ in range(400)]
pen = Penalties(SamplingParams(repetition_penalty=1.1, presence_penalty=0.5), prompt, 151936)
logits = torch.randn(5, 151936)
for rows in (1, 5):
    paths = [answer[:j] for j in range(rows)]
    out["penalties"][f"{rows} row(s)"] = {"ms": ms(lambda: pen.rows(answer, paths).apply(logits[:rows]))}
print(json.dumps(out, indent=1))
