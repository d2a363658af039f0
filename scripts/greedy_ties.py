"""Where two engines' greedy outputs part, is it a near-tie? For each prompt of a `specdec bench` run
whose tokens differ between two methods (ours `plain` and llama.cpp's `llama`, say), this takes the
common prefix and scores the next position with our quantized kernels and with the fp32 torch
reference (the same file's weights dequantized), and prints each one's logit margin between the two
engines' tokens, its gap to the runner-up, and how far the quantized logits lie from the fp32 ones there. A margin a few hundredths of a logit wide is a tie
within 8-bit activation arithmetic; a wide one that the fp32 reference shares is a real difference.

Usage: python scripts/greedy_ties.py --model gemma3-270m --records docs/results/raw/gemma3/records.jsonl \
    [--a plain] [--b llama] [--dataset FILE] > runs/greedy-ties.json
"""

import argparse
import json
from pathlib import Path

import torch

from specdec.bench.compare import encode_turns
from specdec.bench.datasets import load_prompts
from specdec.model import load_model


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@torch.inference_mode()
def next_logits(model, ids: list[int]) -> torch.Tensor:
    module = model.module
    x = torch.tensor([ids])
    return module(x, module.new_cache(len(ids) + 1), 0, last_only=True)[0, -1].float()  # [vocab]


def margins(logits: torch.Tensor, ours: int, theirs: int) -> dict:
    top2 = logits.topk(2)
    return {"ours_minus_theirs": round((logits[ours] - logits[theirs]).item(), 4),
            "top": int(top2.indices[0]), "top_gap": round((top2.values[0] - top2.values[1]).item(), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--records", required=True, help="a bench run's records.jsonl")
    ap.add_argument("--a", default="plain", help="our method (default: plain)")
    ap.add_argument("--b", default="llama", help="the other engine's method (default: llama)")
    ap.add_argument("--dataset", default=None, help="the run's prompts (default: the shipped code prompts)")
    args = ap.parse_args()
    if not Path(args.records).is_file():
        raise SystemExit(f"no such records file: {args.records} (a `specdec bench --out DIR` run's DIR/records.jsonl)")
    quiet = lambda *a: None  # noqa: E731
    quant = load_model(args.model, device="cpu", progress=quiet)
    ref = load_model(args.model, device="cpu", weight_dtype="float32", progress=quiet)
    prompts = {p.id: p for p in load_prompts(args.dataset)}
    tokens: dict[str, dict[str, list[int]]] = {}
    for line in open(args.records):
        r = json.loads(line)
        if r.get("repeat", 0) == 0 and r["method"] in (args.a, args.b) and r.get("tokens"):
            tokens.setdefault(r["prompt_id"], {})[r["method"]] = r["tokens"]
    rows = []
    for pid, pair in sorted(tokens.items()):
        a, b = pair.get(args.a), pair.get(args.b)
        if a is None or b is None:
            continue
        i = first_difference(a, b)
        row = {"prompt": pid, "tokens": min(len(a), len(b)), "first_difference": i}
        if i is not None:
            ids = encode_turns(quant.tokenizer, [{"role": "user", "content": prompts[pid].turns[0]}]) + a[:i]
            q, f = next_logits(quant, ids), next_logits(ref, ids)
            # how far the quantized arithmetic moves a logit here: the spread a margin is held against
            row.update(ours=a[i], theirs=b[i], quantized=margins(q, a[i], b[i]), fp32_reference=margins(f, a[i], b[i]),
                       quantized_vs_fp32={"rms": round((q - f).pow(2).mean().sqrt().item(), 4),
                                          "top50_max": round((q - f)[f.topk(50).indices].abs().max().item(), 4)})
        rows.append(row)
    print(json.dumps({"model": args.model, "a": args.a, "b": args.b, "records": args.records, "prompts": rows},
                     indent=1))


if __name__ == "__main__":
    main()
