"""`specdec loadtest`: drive a real `specdec serve` at several concurrency levels, per speculation mode.

For each mode (off: plain decoding; on: the drafter at a fixed k; policy: the adaptive policy with
the batch size) it starts `specdec serve` as a subprocess on loopback, waits for /health, and for
each concurrency level c sends `requests_per_level(c)` streaming chat completions from c client
threads at once (Spec-Bench prompts, greedy, `max_tokens`). Per request it records the status,
latency, time to first token, completion tokens and the speculative usage the server reports
(steps, plain steps, drafted, accepted). Then SIGTERM, and the next mode. By default (`--order
level`) the loop is level-major: at each level every mode gets a fresh server in turn, in
alternating order (ABC, then CBA), so machine drift over the run hits every mode alike, as the
bench's interleaving does; `--order mode` keeps one server per mode for all levels.

Per mode and level it reports: throughput (completion tokens / wall seconds of the level), p50 and
p95 latency, p50 time to first token, mean time per output token, the fraction of verify steps
that drafted (speculation on), and the failures (any non-200 other than a deliberate 429).
"""

from __future__ import annotations

import json
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from specdec.errors import SpecdecError

MODES = ("off", "on", "policy")


@dataclass
class Result:
    mode: str
    concurrency: int
    prompt_id: str
    status: int  # HTTP status (0 = no response: connection error)
    seconds: float
    ttft: float | None
    completion_tokens: int
    steps: int
    plain_steps: int
    drafted: int
    accepted: int
    tau: float = 0.0
    error: str | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mode_flags(mode: str, draft: str | None, k: int, ngram: bool = False) -> list[str]:
    """serve flags for a mode: off = plain; on = the drafter at k; policy = the drafter, adaptive k."""
    if mode == "off":
        return ["--draft", "none"]
    if draft is None and not ngram:
        raise SpecdecError(f"mode {mode!r} needs a drafter: give --draft MODEL or --ngram")
    flags = (["--ngram"] if ngram else ["--draft", draft]) + ["--k", str(k)]
    return flags + ["--policy", "adaptive" if mode == "policy" else "fixed"]


def start_server(model: str, flags: list[str], port: int, max_batch: int, log_path: Path,
                 timeout: float = 900.0) -> subprocess.Popen:
    """`specdec serve` in a subprocess; returns once /health answers (or raises with the log's tail)."""
    import httpx
    cmd = [sys.executable, "-m", "specdec.cli", "serve", "--model", model, "--port", str(port),
           "--max-batch", str(max_batch), "--max-queue", str(4 * max_batch),
           *flags]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SpecdecError(f"the server exited with {proc.returncode}: {tail(log_path)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    proc.kill()
    raise SpecdecError(f"the server did not become healthy in {timeout:.0f} s: {tail(log_path)}")


def tail(path: Path, n: int = 600) -> str:
    try:
        return path.read_text()[-n:]
    except OSError:
        return ""


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def one_request(base: str, model: str, prompt, max_tokens: int, mode: str, c: int, timeout: float,
                chat: bool = True) -> Result:
    """One streaming (chat) completion; the time to first token is the first text delta's arrival."""
    import httpx
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt.turns[0]}]
    else:
        body["prompt"] = prompt.turns[0]
    t0 = time.perf_counter()
    ttft, usage, status, error = None, {}, 0, None
    try:
        url = f"{base}/v1/chat/completions" if chat else f"{base}/v1/completions"
        with httpx.stream("POST", url, json=body, timeout=timeout) as r:
            status = r.status_code
            if status != 200:
                error = r.read().decode(errors="replace")[:200]
            else:
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    choice = (chunk.get("choices") or [{}])[0]
                    if ttft is None and (choice.get("text") or (choice.get("delta") or {}).get("content")):
                        ttft = time.perf_counter() - t0
                    if chunk.get("usage"):
                        usage = chunk["usage"]
    except (httpx.HTTPError, ValueError) as e:
        error = f"{type(e).__name__}: {e}"
    spec = usage.get("speculative", {})
    return Result(mode, c, prompt.id, status, time.perf_counter() - t0, ttft, usage.get("completion_tokens", 0),
                  spec.get("steps", 0), spec.get("plain_steps", 0), spec.get("drafted", 0), spec.get("accepted", 0),
                  spec.get("tau", 0.0), error)


def run_level(base: str, model: str, prompts: list, c: int, n: int, max_tokens: int, mode: str,
              timeout: float, chat: bool = True) -> tuple[list[Result], float]:
    """n requests from c threads at once (each thread takes the next prompt when it finishes one)."""
    results: list[Result] = []
    lock = threading.Lock()
    todo = list(range(n))

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            r = one_request(base, model, prompts[i % len(prompts)], max_tokens, mode, c, timeout, chat)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def summarize_level(results: list[Result], wall: float) -> dict:
    ok = [r for r in results if r.status == 200 and r.error is None]
    tokens = sum(r.completion_tokens for r in ok)
    steps = sum(r.steps for r in ok)
    tpots = [(r.seconds - r.ttft) / (r.completion_tokens - 1) for r in ok if r.ttft and r.completion_tokens > 1]
    return {
        "requests": len(results), "ok": len(ok), "rejected_429": sum(r.status == 429 for r in results),
        "failed": sum(r.status not in (200, 429) or (r.status == 200 and r.error is not None) for r in results),
        "wall_seconds": round(wall, 2), "throughput_tokens_per_second": round(tokens / wall, 3) if wall else None,
        "latency_p50": _r(percentile([r.seconds for r in ok], 0.5)),
        "latency_p95": _r(percentile([r.seconds for r in ok], 0.95)),
        "ttft_p50": _r(percentile([r.ttft for r in ok if r.ttft is not None], 0.5)),
        "ttft_p95": _r(percentile([r.ttft for r in ok if r.ttft is not None], 0.95)),
        "tpot_mean": _r(statistics.mean(tpots) if tpots else None),
        "speculation_on_fraction": round((steps - sum(r.plain_steps for r in ok)) / steps, 3) if steps else None,
        "tau": round(sum(r.tau * r.steps for r in ok) / steps, 3) if steps else None,
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def requests_per_level(c: int, minimum: int) -> int:
    return max(minimum, 2 * c)


def markdown(summary: dict) -> str:
    rows = ["| mode | conc. | ok / sent | 429 | failed | tok/s | p50 lat (s) | p95 lat (s) | p50 TTFT (s) | "
            "TPOT (s) | spec on | tau | per replica |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, levels in summary["modes"].items():
        for c, s in levels.items():
            replicas = " ".join(f"{n}" for _, n in sorted(s.get("per_replica", {}).items())) or "-"
            rows.append(f"| {mode} | {c} | {s['ok']} / {s['requests']} | {s['rejected_429']} | {s['failed']} | "
                        f"{s['throughput_tokens_per_second']} | {s['latency_p50']} | {s['latency_p95']} | "
                        f"{s['ttft_p50']} | {s['tpot_mean']} | {s['speculation_on_fraction']} | {s['tau']} | "
                        f"{replicas} |")
    return "\n".join(rows) + "\n"


def front_stats(base: str) -> dict | None:
    """A --ray front's counts ({'front': ..., 'replicas': {id: counts}}), or None for one server."""
    import httpx
    try:
        got = httpx.get(base + "/stats", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return None
    return got if "front" in got else None


def replica_deltas(before: dict | None, after: dict | None) -> dict:
    """Requests each replica answered, and the front's retries and failures, between two snapshots."""
    if not before or not after:
        return {}
    per = {rid: row.get("answered", 0) - before["replicas"].get(rid, {}).get("answered", 0)
           for rid, row in after["replicas"].items()}
    return {"per_replica": {rid: n for rid, n in per.items() if n},
            "retried": after["front"]["retried"] - before["front"]["retried"],
            "front_failed": after["front"]["failed"] - before["front"]["failed"]}


def run_loadtest(args) -> dict:
    from specdec.bench.datasets import load_prompts
    from specdec.runner import log
    levels = [int(x) for x in str(args.concurrency).split(",") if x.strip()]
    if not levels or min(levels) < 1:
        raise SpecdecError(f"--concurrency needs positive integers such as 1,2,4,8,16; got {args.concurrency!r}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise SpecdecError(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}")
    prompts = load_prompts(args.dataset)
    if args.categories:
        keep = set(args.categories.split(","))
        prompts = [p for p in prompts if p.category in keep]
    if not prompts:
        raise SpecdecError("no prompts to send")
    # interleave categories so every level sees a mix
    groups: dict[str, list] = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    mixed = [p for row in zip(*groups.values()) for p in row] or prompts
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.draft and args.ngram:
        raise SpecdecError("choose one drafter for the speculative modes: --draft MODEL or --ngram")
    summary = {"config": {"model": args.model, "draft": "ngram" if args.ngram else args.draft, "draft_vocab": args.draft_vocab, "k": args.k, "max_tokens": args.max_tokens,
                          "max_batch": args.max_batch, "concurrency": levels, "modes": modes, "order": args.order,
                          "replicas": args.replicas if args.ray else None,
                          "dataset": args.dataset or "specdec/data/code_prompts.jsonl"}, "modes": {}}
    records = open(out / "records.jsonl", "w")
    common = ["--max-context", str(args.max_context)] + (["--device", args.device] if args.device else []) + (
        ["--dtype", args.dtype] if args.dtype else []) + (["--weight-dtype", args.weight_dtype] if args.weight_dtype else []) + (
        ["--ray", "--replicas", str(args.replicas), "--cpus-per-replica", str(args.cpus_per_replica)] if args.ray else [])
    summary["modes"] = {mode: {} for mode in modes}

    def drive(mode: str, run_levels: list[int], log_name: str) -> None:
        """One server in this mode, warmed up, driven at each of run_levels, then stopped."""
        port = free_port()
        log(f"[{mode}] starting specdec serve on port {port}")
        flags = common + (["--draft-vocab", str(args.draft_vocab)] if mode != "off" and args.draft else [])
        proc = start_server(args.model, flags + mode_flags(mode, args.draft, args.k, args.ngram), port,
                            args.max_batch, out / log_name)
        base = f"http://127.0.0.1:{port}"
        try:
            one_request(base, args.model, mixed[0], 4, mode, 0, args.timeout, not args.completions)  # warm-up
            for c in run_levels:
                n = requests_per_level(c, args.min_requests)
                before = front_stats(base)
                results, wall = run_level(base, args.model, mixed, c, n, args.max_tokens, mode, args.timeout,
                                          not args.completions)
                deltas = replica_deltas(before, front_stats(base))
                for r in results:
                    records.write(json.dumps(asdict(r)) + "\n")
                records.flush()
                s = summarize_level(results, wall) | deltas
                summary["modes"][mode][str(c)] = s
                log(f"[{mode}] c={c}: {s['ok']}/{s['requests']} ok, {s['throughput_tokens_per_second']} tok/s, "
                    f"p50 {s['latency_p50']} s, spec on {s['speculation_on_fraction']}")
        finally:
            stop_server(proc)

    if args.order == "mode":  # one server per mode, every level in turn (fewer restarts, drift between modes)
        for mode in modes:
            drive(mode, levels, f"server-{mode}.log")
    else:  # level by level, modes alternating in order (ABC, CBA, ...), so slow drift hits every mode alike
        for i, c in enumerate(levels):
            for mode in (modes if i % 2 == 0 else modes[::-1]):
                drive(mode, [c], f"server-{mode}-c{c}.log")
    records.close()
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(markdown(summary))
    print(markdown(summary))
    return summary


def add_loadtest_flags(p) -> None:
    from specdec.flags import integer
    p.add_argument("--draft", default=None, help="draft model for the 'on' and 'policy' modes")
    p.add_argument("--ngram", action="store_true", help="the 'on' and 'policy' modes draft by prompt lookup instead")
    p.add_argument("--draft-vocab", type=integer, default=32768,
                   help="the draft model scores only the first N token ids (0 = all; default: %(default)s, as serve)")
    p.add_argument("--modes", default="off,on,policy", help="comma list from off, on, policy")
    p.add_argument("--order", choices=("level", "mode"), default="level",
                   help="level: at each concurrency level run every mode (a fresh server each, order alternating "
                        "ABC, CBA), so drift between modes cancels; mode: one server per mode for all levels")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="client threads at once, per level")
    p.add_argument("--min-requests", type=integer, default=4, help="requests per level: max(this, 2 x concurrency)")
    p.add_argument("--max-tokens", type=integer, default=32)
    p.add_argument("--k", type=integer, default=4)
    p.add_argument("--max-batch", type=integer, default=16, help="the server's slots")
    p.add_argument("--dataset", default=None, help="JSONL prompts (Spec-Bench's question.jsonl works); first turns")
    p.add_argument("--categories", default=None, help="comma list of categories to use")
    p.add_argument("--completions", action="store_true",
                   help="send /v1/completions with the raw prompt (default: /v1/chat/completions, chat template)")
    p.add_argument("--timeout", type=float, default=900.0, help="client timeout per request, seconds")
    p.add_argument("--ray", action="store_true", help="drive `specdec serve --ray` (replicas under Ray Serve); "
                                                        "the table then shows requests answered per replica")
    p.add_argument("--replicas", type=integer, default=2, help="--ray: replicas")
    p.add_argument("--cpus-per-replica", type=float, default=1.0, help="--ray: CPUs per replica")
    p.add_argument("--out", default="runs/loadtest")

