"""Does asking for logprobs cost speed or drafting? The same chat requests through `specdec serve` (the Qwen pair,
the defaults) with and without `logprobs: true, top_logprobs: 5`, alternating which goes first, greedy, 96 tokens:
tok/s, drafted and accepted tokens (usage.speculative), and whether the texts are equal. From the repository root:

    python scripts/logprobs_cost.py     # writes runs/logprobs-cost.json
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from soak import wait_health
from specdec.bench.datasets import load_prompts
from specdec.bench.loadtest import free_port

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


def ask(base: str, prompt: str, logprobs: bool) -> dict:
    body = {"model": TARGET, "messages": [{"role": "user", "content": prompt}], "max_tokens": 96, "temperature": 0}
    if logprobs:
        body.update(logprobs=True, top_logprobs=5)
    t0 = time.perf_counter()
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=600).json()
    return {"tokens": r["usage"]["completion_tokens"], "seconds": time.perf_counter() - t0,
            "spec": r["usage"]["speculative"], "text": r["choices"][0]["message"]["content"]}


def main() -> int:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    Path("runs").mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--model", TARGET, "--draft", DRAFT,
                             "--port", str(port), "--max-context", "2048"],
                            stdout=open("runs/lp-server.log", "w"), stderr=subprocess.STDOUT)
    try:
        wait_health(base, proc)
        prompts = [p.turns[0] for p in load_prompts(None)][:6]
        ask(base, prompts[0], False)  # warm-up
        runs = {"plain": [], "logprobs": []}
        for i, prompt in enumerate(prompts):
            for lp in ((False, True) if i % 2 == 0 else (True, False)):
                runs["logprobs" if lp else "plain"].append(ask(base, prompt, lp))
    finally:
        proc.terminate()
        proc.wait()
    out = {}
    for k, rs in runs.items():
        drafted, accepted = sum(r["spec"]["drafted"] for r in rs), sum(r["spec"]["accepted"] for r in rs)
        out[k] = {"tok_s": round(sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs), 2),
                  "drafted": drafted, "accepted": accepted, "alpha": round(accepted / max(1, drafted), 3)}
    out["same_text"] = sum(a["text"] == b["text"] for a, b in zip(runs["plain"], runs["logprobs"]))
    out["ratio_tok_s"] = round(out["logprobs"]["tok_s"] / out["plain"]["tok_s"], 3)
    print(json.dumps(out, indent=1))
    Path("runs/logprobs-cost.json").write_text(json.dumps({"results": out, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
