"""/completion's sampling against llama-server's on the same file: for each prompt and setting, the next
token's distribution after the sampler chain (llama-server's `post_sampling_probs`) beside ours from the
same token ids, in llama.cpp's order (what /completion applies) and in vLLM's (the OpenAI endpoints'), and
ours in llama.cpp's order applied to llama-server's own logits (its top 200, read from its probabilities
before sampling): that one isolates the sampler chain from the two engines' slightly different logits.
Per pair: whether the kept tokens are the same, and the total variation distance.

  SPECDEC_HOME=... python docs/results/raw/sampler-order-llama-zen4/compare.py \
      --model qwen2.5-coder-0.5b-instruct --llama-bin $SPECDEC_HOME/llama.cpp/src/build/bin --out compare.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from specdec.config import LLAMA_ORDER, SAMPLER_ORDER, SamplingParams  # noqa: E402
from specdec.model import load_model  # noqa: E402
from specdec.model.registry import pull  # noqa: E402
from specdec.sampling.logits import probs_from_logits  # noqa: E402

PROMPTS = ["def fibonacci(n):\n    ", "The capital of France is", "import numpy as np\n\nx = np.",
           "Once upon a time, there was a", "SELECT name FROM users WHERE", "My favourite colour is",
           "for i in range(", "The best way to learn a language is"]
SETTINGS = [(0.8, 40, 0.95, 0.05), (1.5, 40, 0.9, 0.02), (0.5, 100, 0.8, 0.0), (1.2, 20, 0.7, 0.1)]


@torch.inference_mode()
def next_logits(model, ids: list[int]) -> torch.Tensor:
    module = model.module
    return module(torch.tensor([ids]), module.new_cache(len(ids) + 1), 0, last_only=True)[0, -1].float()


def tv(a: dict[int, float], b: dict[int, float]) -> float:
    return 0.5 * sum(abs(a.get(t, 0.0) - b.get(t, 0.0)) for t in set(a) | set(b))


def infill_rows(base: str, model, path: str) -> list[dict]:
    """llama.vscode's sampling (samplers top_k, top_p, infill; top-k 40, top-p 0.99, no temperature) on the
    next token of FIM prompts (the first gaps of docs/results/prompts/fim20.jsonl, and the same prompts a
    few tokens into their answers), ours on llama-server's own logits (its top 200)."""
    from specdec.constraints.vocab import Vocabulary
    from specdec.model.tokenizer import encode_infill
    from specdec.server.llama_api import infill_vocabulary
    tok, size = model.tokenizer, model.module.config.vocab_size
    vocab = infill_vocabulary(Vocabulary.build(tok, size, sorted(model.eos_ids)).tokenizer, model.eos_ids,
                              getattr(tok, "eos_token_id", None))
    params = SamplingParams(1.0, 40, 0.99, order=("top_k", "top_p", "infill", "min_p", "temperature"), infill_vocab=vocab)
    fim = [json.loads(line) for line in open(Path(__file__).resolve().parents[2] / "prompts" / "fim20.jsonl")][:10]
    rows = []
    for case in fim:
        ids = encode_infill(tok, case["prompt"], case["suffix"])
        answer = httpx.post(base + "/completion", timeout=120, json={"prompt": ids, "n_predict": 6, "temperature": 0,
                                                                      "cache_prompt": False, "return_tokens": True}).json()
        for at in (ids, ids + answer["tokens"][:3], ids + answer["tokens"]):
            pre = httpx.post(base + "/completion", timeout=120, json={
                "prompt": at, "n_predict": 1, "n_probs": 200, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                "min_p": 0.0, "cache_prompt": False}).json()["completion_probabilities"][0]["top_logprobs"]
            theirs_logits = torch.full((size,), float("-inf"))
            theirs_logits[[c["id"] for c in pre]] = torch.tensor([c["logprob"] for c in pre])
            post = httpx.post(base + "/completion", timeout=120, json={
                "prompt": at, "n_predict": 1, "n_probs": 200, "post_sampling_probs": True, "top_k": 40, "top_p": 0.99,
                "samplers": ["top_k", "top_p", "infill"], "cache_prompt": False}).json()
            probs = {c["id"]: c["prob"] for c in post["completion_probabilities"][0]["top_probs"] if c["prob"] > 0}
            ours = probs_from_logits(theirs_logits, params)
            mine = {i: ours[i].item() for i in ours.nonzero().flatten().tolist()}
            row = {"prompt": case["id"], "settings": "llama.vscode: top_k 40, top_p 0.99, infill",
                   "llama_kept": len(probs), "infill_on_its_logits": {
                       "kept": len(mine), "same_tokens": set(mine) == set(probs), "tv": round(tv(mine, probs), 5)}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--llama-bin", required=True)
    p.add_argument("--port", type=int, default=8093)
    p.add_argument("--out", type=Path, default=Path("compare.json"))
    args = p.parse_args()
    path = str(pull(args.model))
    server = subprocess.Popen([str(Path(args.llama_bin) / "llama-server"), "-m", path, "--port", str(args.port),
                               "-c", "4096", "-t", "2", "--no-webui"], stdout=open(args.out.with_suffix(".server.log"), "w"),
                              stderr=subprocess.STDOUT)
    base, rows = f"http://127.0.0.1:{args.port}", []
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        model = load_model(path, device="cpu", progress=lambda m: None)
        for text in PROMPTS:
            ids = httpx.post(base + "/tokenize", json={"content": text}).json()["tokens"]
            logits = next_logits(model, ids)
            # llama-server's own logits at its top 200 tokens (its probabilities before any sampler: a softmax of
            # them), the rest -inf: enough for llama.cpp's order, whose top-k (at most 100 here) comes first
            pre = httpx.post(base + "/completion", timeout=120, json={
                "prompt": ids, "n_predict": 1, "n_probs": 200, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                "min_p": 0.0, "cache_prompt": False}).json()["completion_probabilities"][0]["top_logprobs"]
            theirs_logits = torch.full_like(logits, float("-inf"))
            theirs_logits[[c["id"] for c in pre]] = torch.tensor([c["logprob"] for c in pre])
            for t, k, top_p, min_p in SETTINGS:
                theirs = httpx.post(base + "/completion", timeout=120, json={
                    "prompt": ids, "n_predict": 1, "n_probs": 200, "post_sampling_probs": True, "temperature": t,
                    "top_k": k, "top_p": top_p, "min_p": min_p, "cache_prompt": False}).json()
                probs = {c["id"]: c["prob"] for c in theirs["completion_probabilities"][0]["top_probs"] if c["prob"] > 0}
                row = {"prompt": text, "settings": [t, k, top_p, min_p], "llama_kept": len(probs)}
                for name, order, source in (("llama_order", LLAMA_ORDER, logits), ("vllm_order", SAMPLER_ORDER, logits),
                                            ("llama_order_on_its_logits", LLAMA_ORDER, theirs_logits)):
                    ours = probs_from_logits(source, SamplingParams(t, k, top_p, min_p=min_p, order=order))
                    mine = {i: ours[i].item() for i in ours.nonzero().flatten().tolist()}
                    row[name] = {"kept": len(mine), "same_tokens": set(mine) == set(probs), "tv": round(tv(mine, probs), 5)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        rows += infill_rows(base, model, path)
    finally:
        server.terminate()
        server.wait()
    summary = {name: {"same_tokens": sum(r[name]["same_tokens"] for r in mine), "of": len(mine),
                      "tv_median": statistics.median(r[name]["tv"] for r in mine),
                      "tv_max": max(r[name]["tv"] for r in mine)}
               for name in ("llama_order", "vllm_order", "llama_order_on_its_logits", "infill_on_its_logits")
               if (mine := [r for r in rows if name in r])}
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "model": args.model, "summary": summary,
                                    "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
