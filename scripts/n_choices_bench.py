"""n > 1 behind `specdec serve`: a chat request for n samples of one long prompt (Spec-Bench's RAG and
summarization questions), against two servers of the same models, one with the prefix cache (the
prompt prefilled once, its keys/values copied to the other choices' slots) and one with
--no-prefix-cache (every choice prefills it), alternating which goes first. Prints each request's
seconds and the median ratio; writes JSON with the texts (seeded: they must match).

Usage: python scripts/n_choices_bench.py [--model M] [--draft D] [--n 4] [--prompts 3] [--max-tokens 48] OUT.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def wait_healthy(port: int, proc: subprocess.Popen) -> None:
    while proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"the server on port {port} exited ({proc.returncode})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    prompts = [r["turns"][0] for r in rows if r.get("category") in ("rag", "summarization")][:args.prompts]
    specdec = str(Path(sys.executable).with_name("specdec"))
    servers = {}
    for name, port, extra in (("shared", 8411, []), ("unshared", 8412, ["--no-prefix-cache"])):
        cmd = [specdec, "serve", "--model", args.model, "--draft", args.draft, "--port", str(port),
               "--max-batch", str(args.n), *extra]
        servers[name] = (port, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=dict(os.environ),
                                                stderr=open(f"runs/n-choices-{name}.log", "w")))
    res = {name: [] for name in servers}
    try:
        for name, (port, proc) in servers.items():
            wait_healthy(port, proc)
        for r, prompt in enumerate(prompts * 2):
            for name in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
                port = servers[name][0]
                t0 = time.perf_counter()
                out = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=600, json={
                    "model": args.model, "messages": [{"role": "user", "content": prompt}], "n": args.n,
                    "max_tokens": args.max_tokens, "temperature": 0.7, "seed": r}).json()
                res[name].append({"seconds": round(time.perf_counter() - t0, 3), "usage": out["usage"],
                                  "texts": [c["message"]["content"] for c in out["choices"]]})
                print(name, r, res[name][-1]["seconds"], out["usage"]["prompt_tokens"], flush=True)
    finally:
        for _, proc in servers.values():
            proc.terminate()
    same = all(a["texts"] == b["texts"] for a, b in zip(res["shared"], res["unshared"]))
    ratio = statistics.median(b["seconds"] / a["seconds"] for a, b in zip(res["shared"], res["unshared"]))
    summary = {"n": args.n, "max_tokens": args.max_tokens, "median_unshared_over_shared_seconds": round(ratio, 3),
               "same_texts": same}
    print(json.dumps(summary))
    json.dump(summary | {"runs": res}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
