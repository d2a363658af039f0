"""Does the engine draft as the head was validated? A head's greedy k = 1 acceptance in the engine (the
default quantized path, 8-bit head layers, features handed over by the target's verify passes) on the
prompts of held-out self-generated answers of a train-head run (the engine's greedy output is the same
answer), next to the offline estimate (specdec.heads.train.acceptance, fp32) on the same answer tokens.

    python scripts/head_engine_acceptance.py --work HEADS/NAME/work --head heads/MODEL-eagle [--answers 6]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specdec.config import GenerationConfig
from specdec.heads.checkpoint import load_head, target_fingerprint
from specdec.heads.corpus import load_plan
from specdec.heads.extract import ChunkRecord, load_records
from specdec.heads.train import head_acceptance
from specdec.runner import Runner
from specdec.settings import DraftingSettings, ModelSettings

ASSISTANT = [151644, 77091, 198]  # <|im_start|>assistant\n in the Qwen2.5 chat template


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="a train-head run's work directory (plan.json, features/)")
    ap.add_argument("--head", required=True, help="head directory")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--answers", type=int, default=6, help="held-out answers to run")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(2)
    work = Path(args.work)
    chunks = [c for c in load_plan(work / "plan.json").chunks if c.split == "val" and c.id.startswith("self:")]
    chunks = chunks[:args.answers]
    runner = Runner.build(ModelSettings(model=args.model), DraftingSettings(head=args.head, k=1, policy="fixed"),
                          GenerationConfig(max_new_tokens=args.max_new_tokens, k=1))
    lm = runner.target
    head, _ = load_head(args.head, target_fingerprint(lm.module, lm.tokenizer))
    records = {r.id: r for r in load_records(work / "features", {c.id for c in chunks})}
    answers, engine = {}, {}
    for c in chunks:
        toks = c.tokens
        start = max(i for i in range(len(toks) - 2) if toks[i:i + 3] == ASSISTANT) + 3
        result = runner.engine.generate(toks[:start], runner.cfg, lm.eos_ids, None)
        n = min(len(toks), start + args.max_new_tokens)
        r = records[c.id]
        answers[c.id] = [ChunkRecord(r.id, r.tokens[start - 2:n], r.features[start - 2:n], r.top_ids[start - 2:n],
                                     r.top_probs[start - 2:n])]
        engine[c.id] = (result.tokens == toks[start:start + len(result.tokens)], result.stats)
    offline = head_acceptance(head.float(), lm.module, answers, 1)
    rows = [{"id": cid, "same_answer": same, "engine_drafted": s.drafted, "engine_alpha": s.accepted / max(1, s.drafted),
             "offline_positions": offline[cid]["positions"], "offline_alpha": offline[cid]["alpha"][0]}
            for cid, (same, s) in engine.items()]
    drafted, accepted = sum(s.drafted for _, s in engine.values()), sum(s.accepted for _, s in engine.values())
    reach = sum(o["positions"] for o in offline.values())
    passed = sum(round(o["alpha"][0] * o["positions"]) for o in offline.values())
    print(json.dumps({"head": args.head, "work": args.work, "answers": rows,
                      "engine_alpha": accepted / max(1, drafted), "offline_alpha": passed / max(1, reach)}, indent=1))


if __name__ == "__main__":
    main()
