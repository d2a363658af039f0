"""An agent's edit turn through Anthropic's /v1/messages: the conversation so far is a task, the agent's
read_file call and its result (a function from this Python's standard library); the measured turn is
the agent's write_file call with the whole edited file, forced by tool_choice, as a coding agent (Claude
Code, say) writes an edit. One `specdec serve` runs it with the server's drafting (`defaults`) and with
`speculative.n_max` 0 (`plain`), taking turns per task (plain, defaults, defaults, plain), greedy.
Each task's prompt is first put into the prefix cache by a one-token request, timed apart: the timed
turns find the target's prefill done (the draft model's, the defaults' first turn still does), and the
speedup with that prefill added to both sides is reported beside the one without. Per setup: the
median seconds of the turn, output tokens per second, tau, and whether the two setups wrote the same
call (they must: speculation is lossless). A plain turn's tau is above 1 where the grammar of the call
forces tokens (its markers, names and keys), which every setup appends without a forward pass.

  python scripts/agent_bench.py --model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct \
      --limit 8 --max-tokens 384 --out runs/agent.json

Flags after `--` go to `specdec serve` as they are.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdec.bench.loadtest import free_port, start_server, stop_server  # noqa: E402

# standard-library functions of 8-50 lines written in Python, on every machine with this Python
FUNCTIONS = ["colorsys.rgb_to_hls", "textwrap.indent", "shlex.quote", "statistics.median", "fnmatch.filter",
             "html.escape", "colorsys.hls_to_rgb", "base64.b64encode", "calendar.monthrange", "textwrap.dedent"]
TASK = ("Add a docstring and type hints to `{name}` in {path}. Keep the code otherwise exactly as it is. "
        "Read the file, then write it back whole with write_file.")
TOOLS = [{"name": "read_file", "description": "Read a file of the repository.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
                           "additionalProperties": False}},
         {"name": "write_file", "description": "Write a file of the repository, whole.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                           "required": ["path", "content"], "additionalProperties": False}}]
SYSTEM = "You are a careful coding agent. You change files only through the tools."


def tasks(limit: int) -> list[dict]:
    """The conversations up to the measured turn: the task, the read_file call, its result."""
    import importlib
    out = []
    for dotted in FUNCTIONS[:limit]:
        module, name = dotted.rsplit(".", 1)
        source = inspect.getsource(getattr(importlib.import_module(module), name))
        path = f"lib/{module}_{name}.py"
        out.append({"name": dotted, "messages": [
            {"role": "user", "content": TASK.format(name=name, path=path)},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_read", "name": "read_file",
                                               "input": {"path": path}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_read", "content": source}]}]})
    return out


def turn(base: str, model: str, task: dict, max_tokens: int, plain: bool) -> dict:
    body = {"model": model, "max_tokens": max_tokens, "system": SYSTEM, "messages": task["messages"],
            "tools": TOOLS, "tool_choice": {"type": "tool", "name": "write_file", "disable_parallel_tool_use": True},
            "temperature": 0} | ({"speculative.n_max": 0} if plain else {})
    t0 = time.perf_counter()
    r = httpx.post(base + "/v1/messages", json=body, timeout=1800)
    seconds = time.perf_counter() - t0
    if r.status_code != 200:
        raise SystemExit(f"agent_bench: the server answered {r.status_code}: {r.text[:500]}")
    out = r.json()
    usage = out["usage"]
    return {"seconds": seconds, "output_tokens": usage["output_tokens"], "tau": usage["speculative"]["tau"],
            "cache_read": usage["cache_read_input_tokens"], "input_tokens": usage["input_tokens"],
            "stop_reason": out["stop_reason"], "content": out["content"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--draft", default=None, help="the server's draft model (else only the flags after --)")
    p.add_argument("--limit", type=int, default=6, help=f"tasks (at most {len(FUNCTIONS)})")
    p.add_argument("--max-tokens", type=int, default=384)
    p.add_argument("--rounds", type=int, default=1, help="rounds of plain, defaults, defaults, plain per task")
    p.add_argument("--out", type=Path, default=Path("runs/agent.json"))
    p.add_argument("serve", nargs="*", help="more `specdec serve` flags, after --")
    args = p.parse_args()
    if not 1 <= args.limit <= len(FUNCTIONS):
        p.error(f"--limit must be 1..{len(FUNCTIONS)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    flags = (["--draft", args.draft] if args.draft else []) + ["--max-context", "4096", *args.serve]
    port = free_port()
    proc = start_server(args.model, flags, port, 1, args.out.with_suffix(".server.log"))
    base, rows, prefill = f"http://127.0.0.1:{port}", [], {}
    try:
        work = tasks(args.limit)
        turn(base, args.model, work[0], 8, plain=False)  # warm-up, untimed
        for task in work:
            first = turn(base, args.model, task, 1, plain=True)  # the prompt into the prefix cache, timed apart
            prefill[task["name"]] = first["seconds"]
            for _ in range(args.rounds):
                for setup in ("plain", "defaults", "defaults", "plain"):
                    row = turn(base, args.model, task, args.max_tokens, plain=setup == "plain")
                    rows.append({"task": task["name"], "setup": setup} | row)
                    print(f"{task['name']:24s} {setup:8s} {row['seconds']:6.2f}s {row['output_tokens']:4d} tok "
                          f"tau {row['tau']:.2f} cached {row['cache_read']}", flush=True)
    finally:
        stop_server(proc)
    summary = {}
    for setup in ("plain", "defaults"):
        mine = [r for r in rows if r["setup"] == setup]
        summary[setup] = {"median_seconds": statistics.median(r["seconds"] for r in mine),
                          "tok_per_s": sum(r["output_tokens"] for r in mine) / sum(r["seconds"] for r in mine),
                          "tau": statistics.mean(r["tau"] for r in mine),
                          "stop_reasons": sorted({r["stop_reason"] for r in mine})}
    ratios, with_prefill = [], []
    for task in prefill:
        t = [r for r in rows if r["task"] == task]
        plain, spec = (statistics.mean(r["seconds"] for r in t if r["setup"] == s) for s in ("plain", "defaults"))
        ratios.append(plain / spec)
        with_prefill.append((plain + prefill[task]) / (spec + prefill[task]))
    calls = {(r["task"], json.dumps(r["content"][-1].get("input"), sort_keys=True)) for r in rows}
    summary["speedup_per_task"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    summary["speedup_per_task_with_prefill"] = {"median": statistics.median(with_prefill), "min": min(with_prefill),
                                                "max": max(with_prefill)}
    summary["prefill_seconds"] = prefill
    summary["same_call_in_both_setups"] = len(calls) == len({r["task"] for r in rows})
    report = {"command": " ".join(sys.argv), "model": args.model, "draft": args.draft, "serve_flags": flags,
              "max_tokens": args.max_tokens, "summary": summary, "rows": rows}
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
