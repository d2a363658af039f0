"""The cost of one EAGLE draft token against a plain step of its target: c = head entry / target step,
and v(n) for n = 1, 2, 4, in rounds (a random head of the trained head's shape: the cost does not
depend on the weights).

  python scripts/head_cost.py --model qwen2.5-coder-1.5b-instruct --rounds 3 --out docs/results/raw/head-cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdec.drafters.eagle import EagleDrafter, PreparedHead  # noqa: E402
from specdec.heads.modules import build_head, eagle_config  # noqa: E402
from specdec.model import load_model  # noqa: E402
from specdec.policy import measure_costs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft-vocab", type=int, default=32768)
    ap.add_argument("--intermediate-size", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    target = load_model(args.model, device="cpu").module
    head = build_head(eagle_config(target.config, args.draft_vocab, args.intermediate_size))
    head.d2t.copy_(torch.zeros(args.draft_vocab, dtype=torch.long))
    drafter = EagleDrafter(target, PreparedHead(target, head), 2048)
    rounds = []
    for _ in range(args.rounds):
        costs = measure_costs(target, None, sizes=(1, 2, 4))
        entry = drafter.step_seconds()
        rounds.append({"target_step_s": round(costs.step_seconds, 5), "head_entry_s": round(entry, 5),
                       "c": round(entry / costs.step_seconds, 4),
                       "v": {str(n): round(v, 4) for n, v in costs.verify_cost.items()}})
        print(json.dumps(rounds[-1]), flush=True)
    out = {"model": args.model, "weight_format": target.weight_format, "draft_vocab": args.draft_vocab,
           "intermediate_size": args.intermediate_size, "rounds": rounds}
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
