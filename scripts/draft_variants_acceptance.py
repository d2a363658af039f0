"""What a cheaper draft would keep: greedy acceptance of variants of the draft model, measured by
teacher forcing on the target's own greedy answers (the draft's argmax after each prefix of the
target's answer: a chain is accepted up to its first miss, so these agreements give every chain's
accepted length exactly). Variants, all in fp32 with the draft's weights dequantized from its GGUF:
its linear layers rounded as llama.cpp's Q4_0 (what `--draft-bits 4` runs: the reference), as a
3-bit symmetric format of the same shape (32-weight blocks, one fp16 scale: 3.5 bits a weight against
Q4_0's 4.5), and Q4_0 with decoder layers dropped (a depth-pruned draft). The LM head is left as
loaded. Prints JSON: per variant and prompt set, alpha (top-1 agreement) and tau at k (tokens per
verify step of greedy chains of k).

Usage: python scripts/draft_variants_acceptance.py [--k 4] [--max-new-tokens 128] > runs/draft-variants.json
"""

import argparse
import copy
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from specdec.model import load_model
from specdec.model.tokenizer import encode_messages

ROOT = Path(__file__).resolve().parents[1]
SETS = {"code": ROOT / "specdec" / "data" / "code_prompts.jsonl",
        "specbench18": ROOT / "docs" / "results" / "prompts" / "specbench18.jsonl"}


def prompts_of(path: Path) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["prompt"] if "prompt" in r else r["turns"][0] for r in rows]


@torch.inference_mode()
def greedy(module, ids: list[int], n: int, eos: set[int]) -> list[int]:
    cache = module.new_cache(len(ids) + n + 1)
    logits = module(torch.tensor([ids]), cache, 0, last_only=True)
    cache.advance(len(ids))
    out = []
    for _ in range(n):
        tok = int(logits[0, -1].argmax())
        out.append(tok)
        if tok in eos:
            break
        logits = module(torch.tensor([[tok]]), cache, cache.length, last_only=True)
        cache.advance(1)
    return out


def round_blocks(w: torch.Tensor, bits: int) -> torch.Tensor:
    """w rounded in 32-weight blocks as llama.cpp's Q4_0 does at 4 bits (d = the block's signed
    extreme / -2^(bits-1), q = clamp(floor(w / d + 2^(bits-1) + 0.5))), at `bits` bits."""
    half = 2 ** (bits - 1)
    b = w.reshape(-1, 32)
    ext = b.gather(1, b.abs().argmax(1, keepdim=True))
    d = (ext / -half).to(torch.float16).float()
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    q = torch.clamp(torch.floor(b * inv + half + 0.5), 0, 2 * half - 1)
    return ((q - half) * d).reshape(w.shape)


@torch.no_grad()
def variant(base, bits: int, drop: list[int]):
    m = copy.deepcopy(base)
    for layer in m.model.layers:
        for mod in layer.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(round_blocks(mod.weight, bits))
    if drop:
        m.model.layers = torch.nn.ModuleList([ly for i, ly in enumerate(m.model.layers) if i not in drop])
        m.config = dataclasses.replace(m.config, num_layers=len(m.model.layers))
    return m


@torch.inference_mode()
def agreements(module, ids: list[int], answer: list[int]) -> list[bool]:
    seq = ids + answer
    cache = module.new_cache(len(seq) + 1)
    logits = module(torch.tensor([seq]), cache, 0)[0]  # [T, vocab]
    preds = logits[len(ids) - 1:len(seq) - 1].argmax(-1).tolist()
    return [p == t for p, t in zip(preds, answer)]


def tau(agree: list[bool], k: int) -> float:
    pos = steps = 0
    while pos < len(agree):
        run = 0
        while run < k and pos + run < len(agree) and agree[pos + run]:
            run += 1
        steps += 1
        pos += run + 1
    return len(agree) / steps if steps else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--drops", default="20-21,18-21,16-21", help="layer ranges to drop, one variant each ('' for none)")
    ap.add_argument("--skip-formats", action="store_true", help="only the layer drops")
    args = ap.parse_args()
    home = Path(os.environ.get("SPECDEC_HOME", Path.home() / ".cache" / "specdec"))
    answers_path = home / "sim" / f"answers-{args.target}-{args.max_new_tokens}.json"
    target = load_model(args.target, progress=lambda *a: None)
    tok = target.tokenizer
    eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    answers = json.loads(answers_path.read_text()) if answers_path.exists() else {}
    for name, path in SETS.items():
        for i, text in enumerate(prompts_of(path)):
            key = f"{name}/{i}"
            if key not in answers:
                ids = encode_messages(tok, [{"role": "user", "content": text}])
                answers[key] = {"ids": ids, "answer": greedy(target.module, ids, args.max_new_tokens, eos)}
                answers_path.parent.mkdir(parents=True, exist_ok=True)
                answers_path.write_text(json.dumps(answers))
    del target
    draft = load_model(args.draft, weight_dtype="float32", progress=lambda *a: None).module
    variants = {"q4_0": (4, []), "3-bit": (3, [])} if not args.skip_formats else {}
    for r in filter(None, args.drops.split(",")):
        lo, hi = (int(x) for x in r.split("-"))
        variants[f"q4_0 drop {lo}-{hi}"] = (4, list(range(lo, hi + 1)))
    out = {"k": args.k, "max_new_tokens": args.max_new_tokens, "draft_layers": len(draft.model.layers), "variants": {}}
    for vname, (bits, drop) in variants.items():
        m = variant(draft, bits, drop)
        row = {}
        for name in SETS:
            agree = [agreements(m, a["ids"], a["answer"]) for key, a in answers.items() if key.startswith(name + "/")]
            flat = [x for a in agree for x in a]
            row[name] = {"alpha": round(sum(flat) / len(flat), 4),
                         "tau": round(sum(tau(a, args.k) * len(a) for a in agree) / len(flat), 4)}
        out["variants"][vname] = row
        print(json.dumps({vname: row}), flush=True, file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
