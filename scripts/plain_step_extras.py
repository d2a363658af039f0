"""What a plain step pays for a self-drafting head's extras: the target's features (hidden=True) and its
top probability per row (the policy's confidence signal), each alone and together, against a bare plain
verify; the four alternate round by round (medians), on one cache, nothing committed.

Usage: python scripts/plain_step_extras.py [--model qwen2.5-coder-1.5b-instruct] [--rounds 30]
"""

import argparse
import statistics
import time

import torch

from specdec.config import SamplingParams
from specdec.engine.verify import verify
from specdec.model import load_model
from specdec.tree import DraftTree


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    lm = load_model(args.model, progress=lambda *a: None)
    m = lm.module
    cache = m.new_cache(1024)
    ids = lm.tokenizer.encode("def merge(a, b):\n    out = []\n" * 20)
    m(torch.tensor([ids]), cache, 0, last_only=True)
    cache.advance(len(ids))
    greedy = SamplingParams(0.0, 0, 1.0, None)
    modes = [(False, False), (True, False), (False, True), (True, True)]  # (confidence, features)
    ts = {x: [] for x in modes}
    for r in range(args.rounds):
        for conf, feat in (modes if r % 2 == 0 else modes[::-1]):
            t0 = time.perf_counter()
            verify(m, cache, ids[-1], DraftTree.empty(), greedy, None, confidence=conf, features=feat)
            ts[(conf, feat)].append(time.perf_counter() - t0)
    base = statistics.median(ts[(False, False)])
    for (conf, feat), v in ts.items():
        print(f"confidence={conf} features={feat}: {statistics.median(v) * 1e3:.2f} ms  {statistics.median(v) / base:.4f}x")


if __name__ == "__main__":
    main()
