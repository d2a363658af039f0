"""Structured output, side by side: the shipped schema tasks (specdec/data/schema_tasks.jsonl: a prompt
and a JSON Schema each) answered under their schema, greedy, prefill included, by
- plain: constrained plain decoding (no drafter);
- defaults: the defaults (the draft under the policy), the grammar's forced tokens drafted;
- no-forced: the same, without forced drafts;
- llama: llama-server's plain decoding with its own `json_schema` (same file, prompt ids and threads);
interleaved task by task (each task starting one method further on), after an untimed warm-up pass
over the first task; each run starts cold (the draft model keeps no cache of the prompt from the run
before). For every answer: tokens, seconds, finish reason, whether it parses and validates
(jsonschema), and for ours whether the tokens equal plain's, and where the drafter started (new
tokens before it; null: never) on the policy's terms. Prints JSON: per-method records and a summary
(tokens/s and seconds over all tasks, ratios to plain and to llama-server (by tokens/s, and by
seconds over the same tasks: its JSON layout takes more tokens), valid share of the answers that
stopped, answers cut by the budget, greedy mismatches).

Usage: python scripts/structured_bench.py [--model qwen2.5-coder-1.5b-instruct] [--draft qwen2.5-coder-0.5b-instruct]
    [--limit N] [--max-new-tokens 256] [--methods plain,defaults,no-forced,llama] [--llama-bin DIR] \
    [--drafting=--ngram] > runs/structured.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from specdec.bench.host import cpu_name  # noqa: E402
from specdec.cli import build_parser  # noqa: E402
from specdec.config import GenerationConfig  # noqa: E402
from specdec.constraints import ConstraintSpec  # noqa: E402
from specdec.drafters.base import NoDrafter  # noqa: E402
from specdec.engine.engine import Engine  # noqa: E402
from specdec.flags import settings  # noqa: E402
from specdec.model.tokenizer import encode_messages  # noqa: E402
from specdec.runner import Runner  # noqa: E402
from specdec.settings import DraftingSettings, ModelSettings  # noqa: E402

TASKS = ROOT / "specdec" / "data" / "schema_tasks.jsonl"


class Timed:
    """A constraint whose calls are timed (seconds, summed over the run)."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return attr(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
        return timed


class NoForced:
    """A constraint whose forced tokens are never offered (the drafter alone drafts)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forced(self, limit: int, after=()) -> list[int]:
        return []


def messages_of(task: dict) -> list[dict]:
    return [{"role": "system", "content": "Answer with JSON only, matching this JSON Schema: "
             + json.dumps(task["schema"])}, {"role": "user", "content": task["prompt"]}]


def check(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--limit", type=int, default=0, help="the first N tasks (0: all)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--methods", default="plain,defaults,no-forced,llama")
    ap.add_argument("--llama-bin", default=None)
    ap.add_argument("--drafting", default=None,
                    help="generate's drafting flags for the speculative methods, one string given as --drafting=... "
                         "(default: --draft DRAFT, the defaults); e.g. --drafting=--ngram")
    args = ap.parse_args()
    tasks = [json.loads(line) for line in TASKS.read_text().splitlines()]
    tasks = tasks[:args.limit] if args.limit else tasks
    methods = args.methods.split(",")
    drafting_flags = args.drafting.split() if args.drafting else ["--draft", args.draft]
    flags = build_parser().parse_args(["generate", "--model", args.model, *drafting_flags,
                                       "--max-new-tokens", str(args.max_new_tokens), "x"])
    model, drafting = settings(ModelSettings, flags), settings(DraftingSettings, flags)
    cfg = GenerationConfig(args.max_new_tokens, drafting.k)
    runner = Runner.build(model, drafting, cfg)
    tok, eos = runner.target.tokenizer, runner.target.eos_ids
    plain = Engine.single(runner.engine.target, NoDrafter(), model.max_context, cache=runner.engine.cache)
    peer = None
    if "llama" in methods:
        from specdec.bench.llama_server import LlamaServerPeer, find_binary
        from specdec.model.registry import resolve_model
        import torch
        peer = LlamaServerPeer(find_binary(args.llama_bin), resolve_model(args.model), None, eos, model.max_context,
                               torch.get_num_threads(), ROOT / "runs")
    records = []
    for n, (i, task) in enumerate([(0, tasks[0])] + list(enumerate(tasks))):  # first: an untimed warm-up
        ids = encode_messages(tok, messages_of(task))
        spec = ConstraintSpec("json_schema", task["schema"])
        order = methods[i % len(methods):] + methods[:i % len(methods)]
        for m in order:
            t0 = time.perf_counter()
            if m == "llama":
                tokens, seconds = peer.generate(ids, args.max_new_tokens, json_schema=task["schema"])
                finish = "stop" if tokens and tokens[-1] in eos else "length"
            else:
                c = Timed(runner.constraint(spec))
                engine = plain if m == "plain" else runner.engine
                runner.engine.drafter.start(ids[:1])  # cold: no draft cache left from the method before
                res = engine.generate(ids, cfg, eos, constraint=NoForced(c) if m == "no-forced" else c)
                tokens, seconds, finish = res.tokens, time.perf_counter() - t0, res.finish_reason
                grammar = {"grammar_seconds": c.seconds, "steps": res.stats.steps,
                           "decode_seconds": seconds - res.stats.prefill_seconds,
                           "draft_started_at": res.stats.draft_started_at, "admission": res.stats.draft_admission}
            text = tok.decode([t for t in tokens if t not in eos], skip_special_tokens=True)
            if n == 0:
                continue
            records.append({"task": task["id"], "method": m, "tokens": len(tokens), "seconds": seconds,
                            "finish": finish, "valid": check(text, task["schema"]), "ids": tokens}
                           | (grammar if m != "llama" else {}))
            print(f"[{i + 1}/{len(tasks)}] {task['id']} {m:9s} {len(tokens):4d} tok {len(tokens) / seconds:6.2f} tok/s "
                  f"{finish} valid={records[-1]['valid']}", file=sys.stderr)
    if peer is not None:
        peer.close()
    print(json.dumps({"cpu": cpu_name(), "model": args.model, "drafting": " ".join(drafting_flags), "method": runner.method,
                      "tasks": len(tasks),
                      "max_new_tokens": args.max_new_tokens, "summary": summary(records, methods),
                      "records": [{k: v for k, v in r.items() if k != "ids"} for r in records]}, indent=1))


def summary(records: list[dict], methods: list[str]) -> dict:
    by = {m: [r for r in records if r["method"] == m] for m in methods}
    plain_ids = {r["task"]: r["ids"] for r in by.get("plain", [])}
    out = {}
    for m, rs in by.items():
        tps = sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs)
        stopped = [r for r in rs if r["finish"] == "stop"]
        out[m] = {"tok_s": round(tps, 2), "valid_of_stopped": f"{sum(r['valid'] for r in stopped)}/{len(stopped)}",
                  "cut_by_length": len(rs) - len(stopped)}
        if m not in ("plain", "llama") and plain_ids:
            out[m]["greedy_mismatches"] = sum(r["ids"] != plain_ids[r["task"]] for r in rs)
        if m != "llama":  # the grammar's work per step, in plain decoding steps (plain's seconds per step)
            out[m]["grammar_ms_per_step"] = round(1000 * sum(r["grammar_seconds"] for r in rs)
                                                  / sum(r["steps"] for r in rs), 3)
    if "plain" in by:
        step = sum(r["decode_seconds"] for r in by["plain"]) / sum(r["steps"] for r in by["plain"])
        for m in out:
            if "grammar_ms_per_step" in out[m]:
                out[m]["grammar_share_of_a_plain_step"] = round(out[m]["grammar_ms_per_step"] / 1000 / step, 4)
    seconds = {m: sum(r["seconds"] for r in rs) for m, rs in by.items()}
    for m in out:
        out[m]["seconds"] = round(seconds[m], 2)
        for ref in ("plain", "llama"):
            if ref in out and m != ref:
                out[m][f"x_{ref}"] = round(out[m]["tok_s"] / out[ref]["tok_s"], 3)
        if "llama" in out and m != "llama":  # the same answers in seconds: llama-server's JSON layout takes more tokens
            out[m]["x_llama_by_time"] = round(seconds["llama"] / seconds[m], 3)
    return out


if __name__ == "__main__":
    main()
