"""A depth-pruned draft: the 0.5B draft without its N decoder layers of least block influence (1 - the
cosine of a layer's input and output hidden states, averaged over the shipped code prompts' tokens;
ShortGPT's measure; never the first or the last layer), against the whole draft. Plain decoding and the
defaults (the pruned draft under the policy) on the 10 code prompts, 128 new tokens, greedy, two
rounds, the order alternating prompt by prompt. Prints one JSON line: the layers dropped, tok/s, the
defaults over plain, alpha and tau.

Usage: python scripts/draft_depth_prune.py N   (N = 0: the whole draft)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.cli import build_parser  # noqa: E402
from specdec.config import GenerationConfig  # noqa: E402
from specdec.drafters.base import NoDrafter  # noqa: E402
from specdec.engine.engine import Engine  # noqa: E402
from specdec.flags import settings  # noqa: E402
from specdec.model import cpu_forward  # noqa: E402
from specdec.model.partial import forward_layers  # noqa: E402
from specdec.model.tokenizer import encode_messages  # noqa: E402
from specdec.runner import Runner  # noqa: E402
from specdec.settings import DraftingSettings, ModelSettings  # noqa: E402


@torch.inference_mode()
def block_influence(model, prompts: list[list[int]]) -> torch.Tensor:
    """# [layers]: 1 - cos(a layer's input, its output), averaged over the prompts' positions."""
    n = len(model.model.layers)
    bi = torch.zeros(n)
    for ids in prompts:
        cache = model.new_cache(len(ids) + 1)
        x = model.embed(torch.tensor([ids]))
        for i in range(n):
            y = forward_layers(model, x, cache, 0, [i])
            bi[i] += 1 - torch.nn.functional.cosine_similarity(x[0], y[0], dim=-1).mean()
            x = y
    return bi / len(prompts)


def prune(drafter, drop: set[int]) -> None:
    """The drafter's model without layers `drop` (its C layer loop and its cache rebuilt)."""
    m = drafter.model
    m.model.layers = nn.ModuleList([layer for i, layer in enumerate(m.model.layers) if i not in drop])
    m.config = dataclasses.replace(m.config, num_layers=len(m.model.layers))
    cpu_forward.enable(m)
    drafter.cache = m.new_cache(drafter.cache.capacity)
    drafter.cached, drafter.committed = [], 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("drop", type=int, help="decoder layers to drop (0: the whole draft)")
    args = ap.parse_args()
    if args.drop < 0:
        ap.error(f"N must be >= 0 layers, got {args.drop}")
    flags = build_parser().parse_args(["generate", "--model", "qwen2.5-coder-1.5b-instruct", "--draft",
                                       "qwen2.5-coder-0.5b-instruct", "--max-new-tokens", "128", "x"])
    model, drafting = settings(ModelSettings, flags), settings(DraftingSettings, flags)
    cfg = GenerationConfig(128, drafting.k)
    runner = Runner.build(model, drafting, cfg)
    tok, eos = runner.target.tokenizer, runner.target.eos_ids
    prompts = [encode_messages(tok, [{"role": "user", "content": p.turns[0]}]) for p in load_prompts()]
    drafter = runner.engine.drafter
    n = len(drafter.model.model.layers)
    if args.drop > n - 2:
        ap.error(f"the draft has {n} layers, of which at most {n - 2} may go (never the first or the last), got {args.drop}")
    order = block_influence(drafter.model, prompts).argsort().tolist()
    drop = set([i for i in order if 0 < i < n - 1][:args.drop])
    prune(drafter, drop)
    plain = Engine.single(runner.engine.target, NoDrafter(), model.max_context, cache=runner.engine.cache)
    tokens, seconds = {"plain": 0, "draft": 0}, {"plain": 0.0, "draft": 0.0}
    steps = drafted = accepted = 0
    for r in range(2):
        for j, ids in enumerate(prompts):
            for method in (("plain", "draft") if (j + r) % 2 == 0 else ("draft", "plain")):
                t0 = time.perf_counter()
                res = (plain if method == "plain" else runner.engine).generate(ids, cfg, eos)
                seconds[method] += time.perf_counter() - t0
                tokens[method] += len(res.tokens)
                if method == "draft":
                    steps, drafted, accepted = steps + res.stats.steps, drafted + res.stats.drafted, \
                        accepted + res.stats.accepted
    rate = {m: tokens[m] / seconds[m] for m in tokens}
    print(json.dumps({"drop": sorted(drop), "layers": n - len(drop), "plain_tok_s": round(rate["plain"], 2),
                      "draft_tok_s": round(rate["draft"], 2), "x_plain": round(rate["draft"] / rate["plain"], 3),
                      "alpha": round(accepted / max(drafted, 1), 3), "tau": round((accepted + steps) / steps, 2)}))


if __name__ == "__main__":
    main()
