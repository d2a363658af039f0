"""Prefill (prompt processing) speed against llama.cpp on the same GGUF file, side by side in one
process: for each prompt length, our forward over the prompt (the CPU backend, logits of the last
position only) and llama-cpp-python's eval of the same token ids, alternating, both on the same
thread count. Prompts are real text (the Spec-Bench questions, concatenated and cut to length), so
the tokens are those of a real prompt. Prints JSON with tokens/s and our speed over llama.cpp's.

Usage: python scripts/prefill_vs_llama.py [--model qwen2.5-coder-1.5b-instruct] [--lengths 128,512,680] \
    [--rounds 3] > runs/prefill-vs-llama.json
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec.model import load_model
from specdec.model.registry import pull

QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def prompt_tokens(tokenizer, n: int) -> list[int]:
    text = "\n".join(t for line in QUESTIONS.read_text().splitlines() for t in json.loads(line)["turns"])
    ids = tokenizer.encode(text)
    if len(ids) < n:
        raise SystemExit(f"only {len(ids)} tokens of prompt text for a length of {n}")
    return ids[:n]


def ours_seconds(module, ids: list[int]) -> float:
    cache = module.new_cache(len(ids) + 1)
    with torch.inference_mode():
        t0 = time.perf_counter()
        module(torch.tensor([ids]), cache, 0, last_only=True)
        return time.perf_counter() - t0


def llama_seconds(llm, ids: list[int]) -> float:
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    return time.perf_counter() - t0


def main() -> None:
    from llama_cpp import Llama
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--lengths", default="128,512,680")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-batch", type=int, default=512, help="llama.cpp's batch (its default)")
    args = ap.parse_args()
    lm = load_model(args.model, progress=lambda *a: None)
    threads = torch.get_num_threads()
    lengths = [int(x) for x in args.lengths.split(",")]
    llm = Llama(model_path=str(pull(args.model)), n_ctx=max(lengths) + 8, n_threads=threads,
                n_threads_batch=threads, n_batch=args.n_batch, verbose=False)
    out = {"model": args.model, "threads": threads, "rounds": args.rounds, "n_batch": args.n_batch,
           "weight_format": lm.module.weight_format, "lengths": {}}
    for n in lengths:
        ids = prompt_tokens(lm.tokenizer, n)
        ours_seconds(lm.module, ids[:32]), llama_seconds(llm, ids[:32])  # warm-up
        ours, theirs = [], []
        for r in range(args.rounds):
            pair = [("ours", ours_seconds, lm.module), ("llama", llama_seconds, llm)]
            for name, fn, m in (pair if r % 2 == 0 else pair[::-1]):
                (ours if name == "ours" else theirs).append(fn(m, ids))
        o, t = statistics.median(ours), statistics.median(theirs)
        out["lengths"][str(n)] = {"ours_tok_s": round(n / o, 2), "llama_tok_s": round(n / t, 2),
                                  "ours_over_llama": round(statistics.median(b / a for a, b in zip(ours, theirs)), 4),
                                  "ours_s": [round(x, 3) for x in ours], "llama_s": [round(x, 3) for x in theirs]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
