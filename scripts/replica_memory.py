"""Memory of `specdec serve --ray` replicas on one machine: each replica is a whole engine whose
repacked weights are private memory (not the GGUF file's shared pages), so two replicas hold two
copies. This starts the server with N replicas, answers one chat request per replica, then reads
every process of the server's tree from /proc: RSS (resident, shared pages counted in each process)
and PSS (shared pages split between the processes that map them), per replica and in all.

    python scripts/replica_memory.py --model qwen2.5-coder-1.5b-instruct --replicas 2 > runs/replica-memory.json
    (add --draft qwen2.5-coder-0.5b-instruct for replicas that draft)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
from pathlib import Path

import httpx

from specdec.bench.loadtest import free_port, start_server, stop_server


def children() -> dict[int, list[int]]:
    """parent pid -> its children's pids, from /proc."""
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(name))
    return tree


def descendants(pid: int) -> list[int]:
    tree, out, todo = children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def memory(pid: int) -> dict | None:
    """RSS and PSS in MB, and the command line, of one process (None if it is gone)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
        pss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
                   if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return None
    return {"pid": pid, "rss_mb": round(rss / 1024, 1), "pss_mb": round(pss / 1024, 1), "cmd": cmd[:120]}


def ask(base: str, model: str) -> None:
    body = {"model": model, "max_tokens": 32, "temperature": 0.0,
            "messages": [{"role": "user", "content": "Write a Python function that reverses a string."}]}
    httpx.post(f"{base}/v1/chat/completions", json=body, timeout=600).raise_for_status()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--max-context", type=int, default=2048)
    args = ap.parse_args()
    port = free_port()
    flags = ["--ray", "--replicas", str(args.replicas), "--max-context", str(args.max_context),
             "--draft", args.draft or "none"]
    log = Path(tempfile.mkdtemp()) / "server.log"
    proc = start_server(args.model, flags, port, 1, log)
    try:
        base = f"http://127.0.0.1:{port}"
        asks = [threading.Thread(target=ask, args=(base, args.model)) for _ in range(2 * args.replicas)]
        for t in asks:
            t.start()
        for t in asks:
            t.join()
        procs = [m for m in map(memory, descendants(proc.pid)) if m]
    finally:
        stop_server(proc)
    replicas = [m for m in procs if m["cmd"].endswith("specdec-replica")]  # the engines (not the front)
    total = lambda ms, key: round(sum(m[key] for m in ms), 1)  # noqa: E731
    print(json.dumps({"model": args.model, "draft": args.draft, "replicas": args.replicas,
                      "max_context": args.max_context,
                      "replica_rss_mb": [m["rss_mb"] for m in replicas], "replica_pss_mb": [m["pss_mb"] for m in replicas],
                      "all_rss_mb": total(procs, "rss_mb"), "all_pss_mb": total(procs, "pss_mb"),
                      "processes": procs}, indent=1))


if __name__ == "__main__":
    main()
