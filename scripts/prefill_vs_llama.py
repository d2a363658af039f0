"""Prefill (prompt processing) speed against llama.cpp on the same GGUF file, side by side: for each
prompt length, our forward over the prompt (the CPU backend, logits of the last position only) and
llama-server's prompt processing of the same token ids (its own `timings.prompt_ms`, prompt cache off),
alternating, both on the same thread count. Prompts are real text (the Spec-Bench questions,
concatenated and cut to length). Prints JSON with tokens/s and our speed over llama.cpp's.

Usage: python scripts/prefill_vs_llama.py [--model qwen2.5-coder-1.5b-instruct] [--lengths 128,512,2048] \
    [--rounds 3] [--llama-bin DIR] > runs/prefill-vs-llama.json
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


def llama_seconds(server, ids: list[int]) -> float:
    out = server.complete({"prompt": ids, "n_predict": 1, "cache_prompt": False, "temperature": 0.0, "top_k": 1})
    return out["timings"]["prompt_ms"] / 1000


def main() -> None:
    from specdec.bench.llama_server import LlamaServer, build_info, find_binary
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--lengths", default="128,512,2048")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-bin", default=None, help="llama-server or its directory (default: as specdec bench)")
    args = ap.parse_args()
    lm = load_model(args.model, progress=lambda *a: None)
    threads = torch.get_num_threads()
    lengths = [int(x) for x in args.lengths.split(",")]
    binary = find_binary(args.llama_bin)
    llm = LlamaServer(binary, pull(args.model), None, max(lengths) + 16, threads,
                      Path("runs") / "prefill-vs-llama-server.log")
    out = {"model": args.model, "threads": threads, "rounds": args.rounds, "llama_cpp": build_info(binary)
           | {"system_info": llm.system_info()}, "weight_format": lm.module.weight_format, "lengths": {}}
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
    llm.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
