"""Spec-Bench's multi-turn questions through `specdec serve` (one server or --ray replicas), in setups
run one after another: each conversation's first turn, then its second with the first answer in the
history. Per setup and turn: time to first token and total time (medians), tau, prompt tokens the
prefix cache held; with replicas, the share of second turns that landed on the first turn's replica.

  python scripts/multiturn_bench.py --model smollm2-135m-instruct --ngram \
      --setups "cache=--max-batch 4" "no-cache=--max-batch 4 --no-prefix-cache" --limit 40 --out runs/mt.json

A setup is NAME=SERVE FLAGS (added to --model and the drafter flags).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdec.bench.loadtest import free_port, start_server, stop_server  # noqa: E402

DATASET = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def conversations(path: Path, limit: int) -> list[dict]:
    rows = [json.loads(line) for line in open(path)]
    multi = [r for r in rows if len(r["turns"]) >= 2]
    by_cat: dict[str, list] = {}
    for r in multi:
        by_cat.setdefault(r["category"], []).append(r)
    mixed = [r for group in zip(*by_cat.values()) for r in group]  # categories interleaved
    return mixed[:limit]


def turn(base: str, model: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed chat turn: its answer, time to first token, total time, usage, replica."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    text, ttft, usage, replica = [], None, {}, None
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(": replica "):
                replica = line[len(": replica "):]
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            delta = ((chunk.get("choices") or [{}])[0].get("delta") or {}).get("content")
            if delta:
                ttft = ttft or time.perf_counter() - t0
                text.append(delta)
            usage = chunk.get("usage") or usage
    return {"text": "".join(text), "ttft": ttft, "seconds": time.perf_counter() - t0, "usage": usage,
            "replica": replica}


def run_setup(base: str, model: str, convs: list[dict], concurrency: int, max_tokens: int) -> list[dict]:
    out, lock, todo = [], threading.Lock(), list(convs)

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                conv = todo.pop(0)
            messages = [{"role": "user", "content": conv["turns"][0]}]
            first = turn(base, model, messages, max_tokens)
            messages += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": conv["turns"][1]}]
            second = turn(base, model, messages, max_tokens)
            with lock:
                out.append({"id": conv["question_id"], "turns": [first, second]})

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def summarize(records: list[dict]) -> dict:
    s = {}
    for i in (0, 1):
        turns = [r["turns"][i] for r in records]
        steps = sum(t["usage"].get("speculative", {}).get("steps", 0) for t in turns)
        emitted = sum(t["usage"].get("completion_tokens", 0) for t in turns)
        s[f"turn{i + 1}"] = {
            "ttft_median": round(statistics.median(t["ttft"] for t in turns if t["ttft"] is not None), 4),
            "seconds_median": round(statistics.median(t["seconds"] for t in turns), 4),
            "seconds_total": round(sum(t["seconds"] for t in turns), 3),
            "prompt_tokens": sum(t["usage"].get("prompt_tokens", 0) for t in turns),
            "cached_tokens": sum(t["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) for t in turns),
            "tau": round(emitted / steps, 4) if steps else None}
    both = [r for r in records if r["turns"][0]["replica"] and r["turns"][1]["replica"]]
    if both:
        s["second_turn_on_first_turns_replica"] = round(
            sum(r["turns"][0]["replica"] == r["turns"][1]["replica"] for r in both) / len(both), 4)
        s["replicas_used"] = len({r["turns"][0]["replica"] for r in both})
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ngram", action="store_true")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--setups", nargs="+", required=True, metavar="NAME=FLAGS")
    ap.add_argument("--limit", type=int, default=40, help="conversations (categories interleaved)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dataset", default=str(DATASET))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    convs = conversations(Path(args.dataset), args.limit)
    drafter = ["--ngram"] if args.ngram else (["--draft", args.draft] if args.draft else ["--draft", "none"])
    result = {"config": {k: v for k, v in vars(args).items() if k != "out"} | {"conversations": len(convs)},
              "setups": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for setup in args.setups:  # (answers: every setup's text, to compare; greedy answers must be equal)
        name, _, flags = setup.partition("=")
        port = free_port()
        extra = shlex.split(flags)
        max_batch = int(extra[extra.index("--max-batch") + 1]) if "--max-batch" in extra else 4
        extra = [f for i, f in enumerate(extra) if f != "--max-batch" and (i == 0 or extra[i - 1] != "--max-batch")]
        proc = start_server(args.model, drafter + ["--max-context", "4096"] + extra, port, max_batch,
                            out.with_suffix(f".{name}.log"))
        try:
            base = f"http://127.0.0.1:{port}"
            turn(base, args.model, [{"role": "user", "content": "Hello"}], 4)  # warm-up
            t0 = time.perf_counter()
            records = run_setup(base, args.model, convs, args.concurrency, args.max_tokens)
            wall = time.perf_counter() - t0
        finally:
            stop_server(proc)
        summary = summarize(records) | {"wall_seconds": round(wall, 2)}
        result["setups"][name] = summary
        result.setdefault("answers", {})[name] = {r["id"]: [t["text"] for t in r["turns"]] for r in records}
        print(name, json.dumps(summary), flush=True)
        out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
