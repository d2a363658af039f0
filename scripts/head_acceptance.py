"""Do two heads draft alike on the same held-out text? Each head's greedy acceptance at draft positions
1..k (its own chains, the teacher being the target's top token) on the held-out chunks of one head's
training run: the features that run extracted (work/plan.json and work/features), so every head is
measured on the same positions, free of the host's speed. Rows by source: ShareGPT text, Python
source, and the target's own answers ("self": to ShareGPT prompts; "self-code": to coding requests;
"self-text": to text requests about ShareGPT's answers).

    python scripts/head_acceptance.py --work HEADS/NAME/work --heads heads/MODEL-eagle HEADS/NAME \
        [--model qwen2.5-coder-1.5b-instruct] > runs/head-acceptance.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specdec.heads.checkpoint import load_head, target_fingerprint
from specdec.model import load_model
from specdec.training.corpus import load_plan
from specdec.training.extract import load_records
from specdec.training.train import head_acceptance


def source_of(chunk_id: str) -> str:
    if chunk_id.startswith("self:task:"):  # the target's answers to coding requests
        return "self-code"
    if chunk_id.startswith("self:text:"):  # to text requests (summaries, translations, answers from a text)
        return "self-text"
    return chunk_id.partition(":")[0].replace("file", "code")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="a train-head run's work directory (plan.json, features/)")
    ap.add_argument("--heads", nargs="+", required=True, help="head directories")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, progress=lambda *a, **k: None)
    work = Path(args.work)
    plan = load_plan(work / "plan.json")
    val = {c.id for c in plan.chunks if c.split == "val"}
    records = load_records(work / "features", val)
    groups = {"all": records}
    for r in records:
        groups.setdefault(source_of(r.id), []).append(r)
    out = {"work": args.work, "positions": {g: sum(r.tokens.numel() for r in rs) for g, rs in groups.items()}, "heads": {}}
    fingerprint = target_fingerprint(lm.module, lm.tokenizer)
    for directory in args.heads:
        head, meta = load_head(directory, fingerprint)
        out["heads"][directory] = {"trained_tokens": meta.get("trained_tokens"),
                                   **head_acceptance(head.float(), lm.module, groups, args.k)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
