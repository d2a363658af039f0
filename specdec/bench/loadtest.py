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

from specdec.bench.datasets import load_prompts
from specdec.engine.build import log
from specdec.errors import SpecdecError
from specdec.settings import LoadtestSettings, ModelSettings


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
                 timeout: float = 900.0, cwd: str | None = None) -> subprocess.Popen:
    """`specdec serve` in a subprocess (run in `cwd`: a checkout there serves its own package); returns once
    /health answers (or raises with the log's tail)."""
    import httpx
    cmd = [sys.executable, "-m", "specdec.cli", "serve", "--model", model, "--port", str(port),
           "--max-batch", str(max_batch), "--max-queue", str(4 * max_batch),
           *flags]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
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
        if prompt.suffix is not None:
            body["suffix"] = prompt.suffix
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


def prompt_mix(lt: LoadtestSettings) -> list:
    """The prompts to send, categories interleaved so that every level sees a mix."""
    prompts = load_prompts(lt.dataset)
    if lt.categories:
        keep = set(lt.categories.split(","))
        prompts = [p for p in prompts if p.category in keep]
    if not prompts:
        raise SpecdecError("no prompts to send")
    groups: dict[str, list] = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    return [p for row in zip(*groups.values()) for p in row] or prompts


def server_flags(model: ModelSettings, lt: LoadtestSettings) -> list[str]:
    """The `specdec serve` flags every mode's server shares."""
    return ["--max-context", str(model.max_context)] + (["--device", model.device] if model.device else []) + (
        ["--dtype", model.dtype] if model.dtype else []) + (
        ["--weight-dtype", model.weight_dtype] if model.weight_dtype else []) + (
        ["--ray", "--replicas", str(lt.replicas), "--cpus-per-replica", str(lt.cpus_per_replica)] if lt.ray else [])


def run_loadtest(model: ModelSettings, lt: LoadtestSettings) -> dict:
    levels, modes = lt.levels(), lt.mode_list()
    mixed = prompt_mix(lt)
    out = Path(lt.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"config": {"model": model.model, "draft": "ngram" if lt.ngram else lt.draft,
                          "draft_vocab": lt.draft_vocab, "k": lt.k, "max_tokens": lt.max_tokens,
                          "max_batch": lt.max_batch, "concurrency": levels, "modes": modes, "order": lt.order,
                          "replicas": lt.replicas if lt.ray else None,
                          "dataset": lt.dataset or "specdec/data/code_prompts.jsonl"},
               "modes": {mode: {} for mode in modes}}
    records = open(out / "records.jsonl", "w")
    common = server_flags(model, lt)

    def drive(mode: str, run_levels: list[int], log_name: str) -> None:
        """One server in this mode, warmed up, driven at each of run_levels, then stopped."""
        port = free_port()
        log(f"[{mode}] starting specdec serve on port {port}")
        flags = common + (["--draft-vocab", str(lt.draft_vocab)] if mode != "off" and lt.draft else [])
        proc = start_server(model.model, flags + mode_flags(mode, lt.draft, lt.k, lt.ngram), port,
                            lt.max_batch, out / log_name)
        base = f"http://127.0.0.1:{port}"
        try:
            one_request(base, model.model, mixed[0], 4, mode, 0, lt.timeout, not lt.completions)  # warm-up
            for c in run_levels:
                n = requests_per_level(c, lt.min_requests)
                before = front_stats(base)
                results, wall = run_level(base, model.model, mixed, c, n, lt.max_tokens, mode, lt.timeout,
                                          not lt.completions)
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

    if lt.order == "mode":  # one server per mode, every level in turn (fewer restarts, drift between modes)
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
