"""Write an adversarial prompt set for the speculation policy: random token ids decoded to text.

Nothing in such a prompt predicts the continuation, so no drafter should be trusted on it; at a
high temperature the output is near-random too. The policy must then fall back to plain decoding.

    python scripts/adversarial_set.py --model qwen2.5-coder-1.5b-instruct --n 4 --out runs/adversarial.jsonl
"""

from __future__ import annotations

import argparse
import json
import random

from specdec.model.tokenizer import load_tokenizer
from specdec.model.registry import resolve_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--n", type=int, default=4, help="number of prompts")
    ap.add_argument("--tokens", type=int, default=48, help="random tokens per prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tok = load_tokenizer(resolve_model(args.model))
    rng = random.Random(args.seed)
    special = set(tok.all_special_ids)
    ids = [i for i in range(min(tok.vocab_size, 150000)) if i not in special]
    with open(args.out, "w") as f:
        for n in range(args.n):
            text = tok.decode([rng.choice(ids) for _ in range(args.tokens)])
            f.write(json.dumps({"id": f"random-{n}", "category": "random_tokens", "prompt": text}) + "\n")
    print(f"{args.n} prompts -> {args.out}")


if __name__ == "__main__":
    main()
