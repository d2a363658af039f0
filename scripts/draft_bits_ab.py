"""The draft model at several --draft-bits side by side: plain decoding and the defaults (the draft under
the policy) with the draft re-encoded at each bit width, interleaved prompt by prompt (the order rotating),
greedy, prefill included. Each width is its own runner (its own draft, policy and cost entry); plain runs
on the first one's target. Every drafted answer is checked token for token against plain decoding's.

Prints one JSON line per width: tok/s, the mean of per-prompt speedups over plain, the speedup of the
totals, alpha, tau and the greedy mismatches; with --out, the per-prompt records too.

Usage: python scripts/draft_bits_ab.py [--bits 4,3] [--dataset JSONL] [--limit N] [--max-new-tokens N]
       [--rounds R] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.bench.host import cpu_name  # noqa: E402
from specdec.cli import build_parser  # noqa: E402
from specdec.config import GenerationConfig  # noqa: E402
from specdec.drafters.base import NoDrafter  # noqa: E402
from specdec.engine.engine import Engine  # noqa: E402
from specdec.flags import settings  # noqa: E402
from specdec.model.tokenizer import encode_messages  # noqa: E402
from specdec.runner import Runner  # noqa: E402
from specdec.settings import DraftingSettings, ModelSettings  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bits", default="4,3", help="draft bit widths, comma-separated (3, 4, 8)")
    ap.add_argument("--dataset", default=None, help="a JSONL of prompts (default: the shipped code prompts)")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the per-prompt records here (JSON)")
    args = ap.parse_args()
    try:
        widths = [int(b) for b in args.bits.split(",")]
    except ValueError:
        ap.error(f"--bits takes integers, got {args.bits!r}")
    if not widths or any(b not in (3, 4, 8) for b in widths):
        ap.error(f"--bits takes widths among 3, 4 and 8, got {args.bits!r}")
    if args.limit < 1 or args.rounds < 1 or args.max_new_tokens < 1:
        ap.error("--limit, --rounds and --max-new-tokens must be >= 1")
    runners = {}
    for b in widths:
        flags = build_parser().parse_args(["generate", "--draft", "qwen2.5-coder-0.5b-instruct", "--draft-bits", str(b),
                                           "--max-new-tokens", str(args.max_new_tokens), "x"])
        model, drafting = settings(ModelSettings, flags), settings(DraftingSettings, flags)
        cfg = GenerationConfig(args.max_new_tokens, drafting.k)  # the defaults' k (the policy's ceiling)
        runners[b] = Runner.build(model, drafting, cfg)
    first = runners[widths[0]]
    tok, eos = first.target.tokenizer, first.target.eos_ids
    chosen = load_prompts(args.dataset)[:args.limit]
    prompts = [encode_messages(tok, [{"role": "user", "content": p.turns[0]}]) for p in chosen]
    plain = Engine.single(first.engine.target, NoDrafter(), 4096, cache=first.engine.cache)
    engines = {"plain": plain, **{f"bits{b}": r.engine for b, r in runners.items()}}
    names = list(engines)
    records = []
    for r in range(args.rounds):
        for j, ids in enumerate(prompts):
            shift = (j + r) % len(names)
            out = {}
            for name in names[shift:] + names[:shift]:
                t0 = time.perf_counter()
                res = engines[name].generate(ids, cfg, eos)
                out[name] = (time.perf_counter() - t0, res)
            for name, (sec, res) in out.items():
                records.append({"round": r, "prompt": j, "category": chosen[j].category, "method": name, "seconds": sec, "tokens": len(res.tokens),
                                "steps": res.stats.steps, "drafted": res.stats.drafted,
                                "accepted": res.stats.accepted,
                                "same_as_plain": list(res.tokens) == list(out["plain"][1].tokens)})
    for name in names[1:]:
        mine = [x for x in records if x["method"] == name]
        base = {(x["round"], x["prompt"]): x for x in records if x["method"] == "plain"}
        ratios = sorted((x["tokens"] / x["seconds"]) / (base[(x["round"], x["prompt"])]["tokens"]
                                                       / base[(x["round"], x["prompt"])]["seconds"]) for x in mine)
        tot = lambda rs, k: sum(x[k] for x in rs)  # noqa: E731
        plain_rs = list(base.values())
        steps, drafted, accepted = tot(mine, "steps"), tot(mine, "drafted"), tot(mine, "accepted")
        print(json.dumps({
            "cpu": cpu_name(), "method": name, "tok_s": round(tot(mine, "tokens") / tot(mine, "seconds"), 2),
            "plain_tok_s": round(tot(plain_rs, "tokens") / tot(plain_rs, "seconds"), 2),
            "x_plain_mean": round(sum(ratios) / len(ratios), 3), "x_plain_median": round(ratios[len(ratios) // 2], 3),
            "x_plain_totals": round((tot(mine, "tokens") / tot(mine, "seconds"))
                                    / (tot(plain_rs, "tokens") / tot(plain_rs, "seconds")), 3),
            "alpha": round(accepted / max(drafted, 1), 3), "tau": round((accepted + steps) / max(steps, 1), 2),
            "mismatches": sum(not x["same_as_plain"] for x in mine)}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"cpu": cpu_name(), "args": vars(args), "records": records}, indent=1))


if __name__ == "__main__":
    main()
