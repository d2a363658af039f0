"""Side-by-side greedy runs: our methods and HF transformers, interleaved prompt by prompt.

Every speculative method's tokens are compared with our plain decoding's, token for token;
mismatches are reported with the prompt id and first differing position.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specdec.bench.datasets import Prompt
from specdec.config import GenerationConfig, NgramConfig
from specdec.engine.generate import SpeculativeGenerator
from specdec.model.tokenizer import encode_messages, encode_prompt
from specdec.runner import build_drafter

OUR_METHODS = ("plain", "draft", "ngram")
HF_METHODS = {"hf": "plain", "hf-assisted": "assisted", "hf-lookup": "lookup"}


@dataclass
class Record:
    prompt_id: str
    category: str
    method: str
    tokens: list[int]
    seconds: float
    stats: list[dict] | None  # per turn, our engine's GenerationStats.summary(); None for peers

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds else 0.0


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class Comparison:
    def __init__(self, target, draft, methods, k: int, max_new_tokens: int, capacity: int = 4096, hf=None,
                 draft_vocab: int = 0):
        self.target, self.methods, self.hf = target, methods, hf
        self.cfg = GenerationConfig(max_new_tokens, k)
        self.engines = {m: SpeculativeGenerator(target.module, build_drafter(
            "none" if m == "plain" else m, target, capacity, draft, NgramConfig(), draft_vocab), capacity)
            for m in methods if m in OUR_METHODS}

    def encode(self, messages: list[dict]) -> list[int]:
        tok = self.target.tokenizer
        if tok.chat_template:
            return encode_messages(tok, messages)
        return encode_prompt(tok, "\n\n".join(m["content"] for m in messages), chat=False)

    def generate(self, ids: list[int], method: str) -> tuple[list[int], float, dict | None]:
        if method in self.engines:
            res = self.engines[method].generate(ids, self.cfg, self.target.eos_ids)
            return res.tokens, res.stats.seconds, res.stats.summary()
        tokens, seconds = self.hf.generate(ids, self.cfg.max_new_tokens, HF_METHODS[method], self.cfg.k)
        return tokens, seconds, None

    def run_one(self, prompt: Prompt, method: str) -> Record:
        """All turns of a prompt; later turns see the method's own earlier answers (Spec-Bench)."""
        messages, tokens, seconds, stats = [], [], 0.0, []
        for turn in prompt.turns:
            messages.append({"role": "user", "content": turn})
            new, secs, st = self.generate(self.encode(messages), method)
            answer = self.target.tokenizer.decode(new, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": answer})
            tokens, seconds = tokens + new, seconds + secs
            stats.append(st)
        return Record(prompt.id, prompt.category, method, tokens, seconds, None if method in HF_METHODS else stats)

    def run(self, prompts: list[Prompt], out: Path) -> list[Record]:
        """Appends to out (JSONL); (prompt, method) pairs already there are not run again (resume)."""
        records = read_records(out)
        done = {(r.prompt_id, r.method) for r in records}
        with out.open("a") as f:
            for i, prompt in enumerate(prompts):
                for method in self.methods:  # interleaved: A B C A B C, so drift hits all alike
                    if (prompt.id, method) in done:
                        continue
                    rec = self.run_one(prompt, method)
                    records.append(rec)
                    f.write(json.dumps(rec.__dict__) + "\n")
                    f.flush()
                    print(f"[{i + 1}/{len(prompts)}] {prompt.id} {method:12s} {len(rec.tokens):4d} tok "
                          f"{rec.tokens_per_second:6.2f} tok/s", file=sys.stderr)
        return records


def read_records(path: Path) -> list[Record]:
    if not path.is_file():
        return []
    with path.open() as f:
        return [Record(**json.loads(line)) for line in f if line.strip()]


def summarize_by_category(records: list[Record]) -> dict:
    categories = sorted({r.category for r in records})
    return {c: summarize([r for r in records if r.category == c]) for c in categories}


def summarize(records: list[Record], reference: str = "plain") -> dict:
    by_method: dict[str, list[Record]] = {}
    for r in records:
        by_method.setdefault(r.method, []).append(r)
    ref = {r.prompt_id: r for r in by_method.get(reference, [])}
    out = {}
    for method, recs in by_method.items():
        out[method] = method_summary(recs, ref, method.startswith("hf"))
    return out


def method_summary(recs: list[Record], ref: dict, peer: bool) -> dict:
    tps = [r.tokens_per_second for r in recs]
    speedups = [r.tokens_per_second / ref[r.prompt_id].tokens_per_second for r in recs if r.prompt_id in ref]
    mismatches = [{"prompt_id": r.prompt_id, "position": first_difference(r.tokens, ref[r.prompt_id].tokens)}
                  for r in recs if r.prompt_id in ref and r.tokens != ref[r.prompt_id].tokens]
    summary = {"prompts": len(recs), "new_tokens": sum(len(r.tokens) for r in recs),
               "seconds": round(sum(r.seconds for r in recs), 2),
               "tokens_per_second_total": round(sum(len(r.tokens) for r in recs) / sum(r.seconds for r in recs), 3),
               "tokens_per_second_median": round(statistics.median(tps), 3),
               "speedup_vs_plain_mean": round(statistics.mean(speedups), 3) if speedups else None,
               "speedup_vs_plain_median": round(statistics.median(speedups), 3) if speedups else None,
               "greedy_mismatches": mismatches}
    if not peer:
        summary.update(acceptance_summary([turn for r in recs for turn in r.stats]))
    return summary


def acceptance_summary(stats: list[dict]) -> dict:
    """Pooled over prompts: alpha = sum accepted / sum drafted; tau = sum emitted / sum steps."""
    steps, drafted, accepted = (sum(s[key] for s in stats) for key in ("steps", "drafted", "accepted"))
    width = max((len(s["drafted_at"]) for s in stats), default=0)
    at = [(sum(s["accepted_at"][i] for s in stats if i < len(s["accepted_at"])),
           sum(s["drafted_at"][i] for s in stats if i < len(s["drafted_at"]))) for i in range(width)]
    return {"tau": round((steps + accepted) / steps, 3) if steps else 0.0,
            "alpha": round(accepted / drafted, 3) if drafted else 0.0,
            "per_position_acceptance": [round(a / d, 3) if d else 0.0 for a, d in at],
            "draft_seconds": round(sum(s["draft_seconds"] for s in stats), 2),
            "verify_seconds": round(sum(s["verify_seconds"] for s in stats), 2),
            "prefill_seconds": round(sum(s["prefill_seconds"] for s in stats), 2)}


def markdown_table(summary: dict) -> str:
    rows = ["| method | tok/s (total) | tok/s (median) | speedup vs plain (mean) | tau | alpha | greedy mismatches |",
            "|---|---|---|---|---|---|---|"]
    for method, s in summary.items():
        rows.append(f"| {method} | {s['tokens_per_second_total']:.2f} | {s['tokens_per_second_median']:.2f} | "
                    f"{s['speedup_vs_plain_mean'] or 0:.3f}x | {s.get('tau', '-')} | {s.get('alpha', '-')} | "
                    f"{len(s['greedy_mismatches'])} |")
    return "\n".join(rows) + "\n"


def select_prompts(prompts: list[Prompt], categories: str | None, limit: int | None) -> list[Prompt]:
    """Keep the named categories (comma list; None = all) and the first `limit` of each."""
    wanted = None if categories is None else {c.strip() for c in categories.split(",") if c.strip()}
    known = {p.category for p in prompts}
    if wanted is not None and not wanted & known:
        from specdec.errors import SpecdecError
        raise SpecdecError(f"no prompts in categories {sorted(wanted)}; the dataset has {sorted(known)}")
    seen: dict[str, int] = {}
    kept = []
    for p in prompts:
        if (wanted is None or p.category in wanted) and seen.get(p.category, 0) < (limit or len(prompts)):
            seen[p.category] = seen.get(p.category, 0) + 1
            kept.append(p)
    return kept


def run_comparison(args) -> dict:
    """`specdec bench`: load models once, run every method on every prompt, write the results."""
    from specdec.bench.datasets import load_prompts
    from specdec.model import load_model
    from specdec.runner import log
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in OUR_METHODS and m not in HF_METHODS]
    if unknown:
        from specdec.errors import SpecdecError
        raise SpecdecError(f"unknown method(s) {unknown}; choose from {list(OUR_METHODS) + list(HF_METHODS)}")
    prompts = select_prompts(load_prompts(args.dataset), args.categories, args.limit)
    target = load_model(args.model, args.device, args.dtype, progress=log, pack=not args.no_pack)
    needs_draft = "draft" in methods or "hf-assisted" in methods
    draft = load_model(args.draft, args.device, args.dtype, progress=log) if needs_draft else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done = {(r.prompt_id, r.method) for r in read_records(out / "records.jsonl")}
    pending = [m for m in methods if any((p.id, m) not in done for p in prompts)]
    hf = make_hf(args, target, draft, pending)  # a resumed run loads HF only if it still has HF work
    t0 = time.time()
    records = Comparison(target, draft, methods, args.k, args.max_new_tokens, args.max_context, hf=hf,
                         draft_vocab=args.draft_vocab).run(prompts, out / "records.jsonl")
    summary = {"config": {"model": args.model, "draft": args.draft if needs_draft else None, "k": args.k,
                          "draft_vocab": args.draft_vocab, "max_new_tokens": args.max_new_tokens, "prompts": len(prompts),
                          "dataset": args.dataset or "specdec/data/code_prompts.jsonl", "greedy": True,
                          "wall_seconds": round(time.time() - t0, 1)},
               "methods": summarize(records), "categories": summarize_by_category(records)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(markdown_table(summary["methods"]))
    print(markdown_table(summary["methods"]))
    return summary


def make_hf(args, target, draft, methods):
    if not any(m in HF_METHODS for m in methods):
        return None
    from specdec.bench.baselines import HFBaseline
    from specdec.model.loading import model_directory
    from specdec.model.registry import resolve_model
    assistant = model_directory(resolve_model(args.draft)) if "hf-assisted" in methods else None
    return HFBaseline(model_directory(resolve_model(args.model)), target.eos_ids, assistant, share=target.module)
