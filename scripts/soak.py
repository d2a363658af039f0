"""A soak with faults against a real `specdec serve`: mixed traffic for a fixed time, then a drain under load.

    python scripts/soak.py --model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct \
        --minutes 30 --concurrency 4 --out runs/soak-qwen
    python scripts/soak.py --model smollm2-135m-instruct --minutes 10 --concurrency 16 --out runs/soak-smol

It starts the server on loopback (its log in OUT/server.log), and `--concurrency` client threads send, until the time
is up, a seeded mix of: chat and completions, streaming and not, some with stop strings; streams the client drops after
a few chunks; requests with a client timeout shorter than their answer; and bad requests (malformed JSON, a value out of
range, an unknown model, a prompt longer than the context) that must get a 4xx.

Each request ends as one of:
  answered   the expected outcome: 200 with a well-formed body (a stream ends with [DONE]), the 4xx a bad request
             must get, a 429 with Retry-After (the queue was full), or the client's own deliberate drop or timeout
  failed     a response, but not the expected one (a 5xx, a 4xx for a good request, a 200 for a bad one, a broken body)
  lost       no response at all for a request that should have had one (connection refused or reset, a stream that
             stops without [DONE])
RSS of the server is sampled every 5 s; "rss_start" is the first sample after the warm-up. After the time is up the
script waits for the server to be idle and reads /stats (busy slots must be 0). With `--drain` it then starts
`--concurrency` long streams (half the context each), sends SIGTERM, and checks that they finish (not aborted) within the grace while new
requests get 503 or a refused connection, and that the server exits 0. Everything goes to OUT/summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from specdec.bench.loadtest import free_port

CODE = ["Write a Python function that checks whether a string is a palindrome.",
        "Write a Python class for a stack with push, pop and peek.",
        "Explain what a Python generator is, with a short example.",
        "Write a function that returns the n-th Fibonacci number iteratively.",
        "Write a SQL query that finds the second highest salary in a table employees(id, salary).",
        "Summarize in two sentences why binary search needs a sorted list.",
        "Translate to French: The weather is nice today, let us go for a walk."]
STOPS = ["\n\n", "return", ".", "```"]


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


class Soak:
    def __init__(self, base: str, model: str, max_tokens: int, context: int, seed: int):
        self.base, self.model, self.max_tokens, self.context = base, model, max_tokens, context
        self.rng_seed = seed
        self.lock = threading.Lock()
        self.results: list[dict] = []

    def record(self, kind: str, outcome: str, seconds: float, status: int | None, detail: str = "") -> None:
        with self.lock:
            self.results.append({"kind": kind, "outcome": outcome, "seconds": round(seconds, 3), "status": status,
                                 "detail": detail[:200], "t": time.time()})

    # --- one request of each kind; each returns (outcome, status, detail)

    def body(self, rng: random.Random, chat: bool, stream: bool, stop: bool) -> dict:
        prompt = rng.choice(CODE)
        b = {"model": self.model, "max_tokens": rng.randint(8, self.max_tokens), "stream": stream,
             "temperature": rng.choice([0.0, 0.0, 0.7]), "seed": rng.randint(0, 1 << 30)}
        if chat:
            b["messages"] = [{"role": "user", "content": prompt}]
        else:
            b["prompt"] = prompt
        if stop:
            b["stop"] = rng.sample(STOPS, rng.randint(1, 2))
        return b

    def good(self, client: httpx.Client, rng: random.Random, chat: bool, stream: bool, stop: bool):
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body = self.body(rng, chat, stream, stop)
        if not stream:
            r = client.post(path, json=body)
            if r.status_code == 429:
                return "answered", 429, "queue full"
            if r.status_code != 200:
                return "failed", r.status_code, r.text
            choice = r.json()["choices"][0]
            text = choice["message"]["content"] if chat else choice["text"]
            if choice["finish_reason"] not in ("stop", "length") or not isinstance(text, str):
                return "failed", 200, f"finish_reason {choice['finish_reason']}"
            return "answered", 200, ""
        with client.stream("POST", path, json=body) as r:
            if r.status_code == 429:
                return "answered", 429, "queue full"
            if r.status_code != 200:
                r.read()
                return "failed", r.status_code, r.text
            done, finish = False, None
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return "failed", 200, json.dumps(chunk["error"])
                for c in chunk.get("choices", []):
                    finish = c.get("finish_reason") or finish
            if not done:
                return "lost", 200, "stream ended without [DONE]"
            if finish not in ("stop", "length"):
                return "failed", 200, f"finish_reason {finish}"
            return "answered", 200, ""

    def disconnect(self, client: httpx.Client, rng: random.Random):
        body = self.body(rng, True, True, False)
        body["max_tokens"] = self.max_tokens
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code == 429:
                return "answered", 429, "queue full"
            if r.status_code != 200:
                r.read()
                return "failed", r.status_code, r.text
            for n, _ in enumerate(r.iter_lines()):
                if n >= 3:
                    break  # leaving the block closes the connection mid-stream
        return "answered", 200, "dropped"

    def timeout(self, rng: random.Random):
        body = self.body(rng, True, False, False)
        body["max_tokens"] = self.max_tokens
        try:
            with httpx.Client(base_url=self.base, timeout=0.3) as c:
                r = c.post("/v1/chat/completions", json=body)
            return ("answered", r.status_code, "answered before the timeout") if r.status_code in (200, 429) \
                else ("failed", r.status_code, r.text)
        except httpx.TimeoutException:
            return "answered", None, "client timed out"

    def bad(self, client: httpx.Client, rng: random.Random):
        which = rng.randrange(5)
        if which == 0:
            r = client.post("/v1/chat/completions", content=b'{"model": "x", "messages": [', headers={
                "content-type": "application/json"})
        elif which == 1:
            r = client.post("/v1/chat/completions", json={
                "model": self.model, "messages": [{"role": "user", "content": "hi"}], "temperature": -1})
        elif which == 2:
            r = client.post("/v1/completions", json={"model": "no-such-model", "prompt": "hi"})
        elif which == 3:
            r = client.post("/v1/completions", json={"model": self.model, "prompt": "word " * (2 * self.context)})
        else:
            r = client.post("/v1/chat/completions", json={"model": self.model, "messages": "not a list"})
        if 400 <= r.status_code < 500 and r.status_code != 429:
            return "answered", r.status_code, f"bad#{which}"
        return "failed", r.status_code, f"bad#{which}: {r.text}"

    def one(self, client: httpx.Client, rng: random.Random) -> None:
        roll = rng.random()
        t0 = time.perf_counter()
        if roll < 0.60:
            chat, stream, stop = rng.random() < 0.6, rng.random() < 0.5, rng.random() < 0.3
            kind = ("chat" if chat else "completion") + ("-stream" if stream else "") + ("-stop" if stop else "")
            fn = lambda: self.good(client, rng, chat, stream, stop)  # noqa: E731
        elif roll < 0.75:
            kind, fn = "disconnect", lambda: self.disconnect(client, rng)  # noqa: E731
        elif roll < 0.85:
            kind, fn = "timeout", lambda: self.timeout(rng)  # noqa: E731
        else:
            kind, fn = "bad", lambda: self.bad(client, rng)  # noqa: E731
        try:
            outcome, status, detail = fn()
        except (httpx.TransportError, httpx.StreamError) as e:
            outcome, status, detail = "lost", None, f"{type(e).__name__}: {e}"
        except Exception as e:  # a broken body, not a transport problem
            outcome, status, detail = "failed", None, f"{type(e).__name__}: {e}"
        self.record(kind, outcome, time.perf_counter() - t0, status, detail)

    def worker(self, i: int, deadline: float) -> None:
        rng = random.Random(self.rng_seed * 1000 + i)
        with httpx.Client(base_url=self.base, timeout=600) as client:
            while time.time() < deadline:
                self.one(client, rng)


def wait_health(base: str, proc: subprocess.Popen, limit: float = 600) -> None:
    t0 = time.time()
    while time.time() - t0 < limit:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before it was healthy")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise SystemExit("the server did not become healthy")


def wait_idle(base: str, limit: float = 120) -> dict:
    t0 = time.time()
    stats = {}
    while time.time() - t0 < limit:
        stats = httpx.get(base + "/stats", timeout=10).json()
        if stats["active"] == 0 and stats["queued"] == 0:
            break
        time.sleep(1)
    return stats


def drain_phase(base: str, model: str, proc: subprocess.Popen, n: int, max_tokens: int, grace: float) -> dict:
    """n long streams in flight, SIGTERM, then new requests: the streams finish, new requests get 503 / refused."""
    finishes: list[str | None] = []
    lock = threading.Lock()
    started = threading.Barrier(n + 1)

    def stream(i: int) -> None:
        finish = None
        try:
            with httpx.Client(base_url=base, timeout=grace + 120) as c, c.stream(
                    "POST", "/v1/completions", json={"model": model, "prompt": CODE[i % len(CODE)],
                                                     "max_tokens": max_tokens, "stream": True}) as r:
                first = True
                for line in r.iter_lines():
                    if first and line.startswith("data: "):
                        first = False
                        started.wait(timeout=300)
                    if line.startswith("data: ") and line[6:] != "[DONE]":
                        for ch in json.loads(line[6:]).get("choices", []):
                            finish = ch.get("finish_reason") or finish
        except Exception as e:  # noqa: BLE001 - recorded
            finish = f"error: {type(e).__name__}"
        with lock:
            finishes.append(finish)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    started.wait(timeout=300)
    t_term = time.time()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    new_status = []
    for _ in range(3):
        try:
            new_status.append(httpx.post(base + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 4},
                                         timeout=10).status_code)
        except httpx.TransportError:
            new_status.append("refused")
        time.sleep(0.2)
    for t in threads:
        t.join()
    streams_done = time.time() - t_term
    try:
        code = proc.wait(timeout=grace + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = "killed after grace + 60 s"
    return {"in_flight": n, "finish_reasons": finishes, "new_requests": new_status,
            "seconds_after_sigterm": round(streams_done, 1), "grace": grace, "exit_code": code}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", default=None, help="the server's --draft (default: the server's own default)")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-context", type=int, default=2048)
    ap.add_argument("--grace", type=float, default=60.0, help="the server's --shutdown-grace")
    ap.add_argument("--drain", action="store_true", help="end with SIGTERM under load")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serve-args", default="", help="more flags for specdec serve")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "specdec.cli", "serve", "--model", a.model, "--port", str(port),
           "--max-context", str(a.max_context), "--shutdown-grace", str(a.grace)]
    if a.draft:
        cmd += ["--draft", a.draft]
    cmd += a.serve_args.split()
    log = open(out / "server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_health(base, proc)
        model = httpx.get(base + "/v1/models", timeout=10).json()["data"][0]["id"]
        soak = Soak(base, model, a.max_tokens, a.max_context, a.seed)
        with httpx.Client(base_url=base, timeout=600) as c:  # warm-up
            for chat in (True, False):
                soak.good(c, random.Random(1), chat, False, False)
        rss: list[tuple[float, float]] = []
        stop_sampling = threading.Event()

        def sample() -> None:
            while not stop_sampling.is_set():
                v = rss_mb(proc.pid)
                if v is not None:
                    rss.append((time.time(), v))
                stop_sampling.wait(5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.time()
        deadline = t0 + 60 * a.minutes
        workers = [threading.Thread(target=soak.worker, args=(i, deadline)) for i in range(a.concurrency)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall = time.time() - t0
        stats = wait_idle(base)
        stop_sampling.set()
        sampler.join()
        res = soak.results
        by_kind: dict[str, dict[str, int]] = {}
        for r in res:
            by_kind.setdefault(r["kind"], {}).setdefault(r["outcome"], 0)
            by_kind[r["kind"]][r["outcome"]] += 1
        lat = [r["seconds"] for r in res if r["outcome"] == "answered" and r["status"] == 200
               and r["kind"] not in ("disconnect", "timeout")]
        after_warm = [v for t, v in rss if t >= t0 + 60] or [v for _, v in rss]
        summary = {
            "command": " ".join(["python", "scripts/soak.py"] + (argv if argv is not None else sys.argv[1:])),
            "server": " ".join(cmd[2:]), "minutes": a.minutes, "concurrency": a.concurrency,
            "wall_seconds": round(wall, 1),
            "sent": len(res),
            "answered": sum(r["outcome"] == "answered" for r in res),
            "failed": sum(r["outcome"] == "failed" for r in res),
            "lost": sum(r["outcome"] == "lost" for r in res),
            "rejected_429": sum(r["status"] == 429 for r in res),
            "by_kind": by_kind,
            "latency_p50_s": pct(lat, 0.5), "latency_p99_s": pct(lat, 0.99),
            "latency_n": len(lat),
            "rss_start_mb": round(after_warm[0], 1) if after_warm else None,
            "rss_end_mb": round(after_warm[-1], 1) if after_warm else None,
            "rss_max_mb": round(max(v for _, v in rss), 1) if rss else None,
            "rss_end_over_start": round(after_warm[-1] / after_warm[0], 4) if after_warm else None,
            "busy_slots_at_end": stats.get("active"), "queued_at_end": stats.get("queued"),
            "problems": [r for r in res if r["outcome"] != "answered"][:20],
        }
        if a.drain:
            summary["drain"] = drain_phase(base, model, proc, a.concurrency, a.max_context // 2, a.grace)
        (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in res))
        (out / "rss.json").write_text(json.dumps(rss))
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps({k: v for k, v in summary.items() if k != "problems"}, indent=1))
        return 0 if summary["lost"] == 0 and summary["failed"] == 0 else 1
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=a.grace + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


if __name__ == "__main__":
    sys.exit(main())
