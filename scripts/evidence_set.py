"""Write the bench evidence prompt set: N Spec-Bench questions per category plus the shipped code prompts.

Categories are interleaved (one prompt of each in turn), so any prefix of an interrupted run covers
every category alike. Spec-Bench is read from its path and never copied into the repository.

    python scripts/evidence_set.py ../shared/data/spec_bench/question.jsonl --per-category 3 --out runs/evidence.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json

from specdec.bench.datasets import load_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec_bench", help="Spec-Bench question.jsonl")
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    groups: dict[str, list] = {}
    for p in load_prompts(args.spec_bench):
        groups.setdefault(p.category, []).append(p)
    # multi_turn: one question from each MT-bench subcategory in turn (ids 81, 91, 101, ...), not 3 of 'writing'
    groups["multi_turn"] = sorted(groups.get("multi_turn", []), key=lambda p: ((int(p.id) - 1) % 10, int(p.id)))
    picked = [g[:args.per_category] for g in groups.values()] + [load_prompts()]
    rows = [p for p in itertools.chain(*itertools.zip_longest(*picked)) if p is not None]
    with open(args.out, "w") as f:
        for p in rows:
            f.write(json.dumps({"id": p.id, "category": p.category, "turns": list(p.turns)}) + "\n")
    print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
