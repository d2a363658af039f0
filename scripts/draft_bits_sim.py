"""How well a draft re-encoded at fewer bits would guess: each encoding's weights simulated in fp32 (the
torch reference), the draft teacher-forced over the target's own greedy answers, and the share of answer
positions where its greedy pick (over the ids --draft-vocab lets it score) is the target's token. That
share is the greedy acceptance a chain sees token by token, before any kernel is written.

Encodings (32-weight blocks, one fp16 scale each; the LM head at 4 bits unless said):
  file      the GGUF's own blocks;
  q4        `--draft-bits 4`: the 32-weight formats and Q6_K as Q4_0, Q4_K as it is;
  q3        every weight as symmetric 3-bit (q in -4..3), scale = the largest-magnitude weight / -4;
  q3-k      Q4_K kept, the rest as q3, the LM head at 4 bits (q4);
  q3-kh     Q4_K kept, the rest as q3, the LM head too;
  q3-gu     the MLP's gate and up at 3 bits, the rest as q4 (what `--draft-bits 3` runs);
  NAME-rmse any 3-bit one with the scale searched per block for the least squared error (q3-rmse, ...).
Each encoding's bytes for one draft step (its layers and its cut LM head) are printed beside it.

The target's answers (plain decoding, greedy, 128 new tokens) are cached under $SPECDEC_HOME/sim/.
Usage: python scripts/draft_bits_sim.py [--encodings file,q4,q3,q3-k,q3-gu] [--dataset JSONL --limit N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.config import GenerationConfig  # noqa: E402
from specdec.drafters.base import NoDrafter  # noqa: E402
from specdec.engine.engine import Engine  # noqa: E402
from specdec.model import gguf_config, load_model, loading  # noqa: E402
from specdec.model.registry import resolve_model, specdec_home  # noqa: E402
from specdec.model.tokenizer import encode_messages  # noqa: E402

TARGET, DRAFT, VOCAB, NEW = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", 32768, 128
Q4_K = 12
FOUR_BIT = loading.LOW_BIT_SOURCES  # what a draft re-encodes (Q4_K stays)
KINDS = ("file", "q4", "q3", "q3-k", "q3-kh", "q3-gu")  # a 3-bit one may end in -rmse
STORED_BITS = {4: 4.5, 3: 3.5}  # bits a weight with the fp16 scale of 32


def q4_0(w: torch.Tensor) -> torch.Tensor:
    """llama.cpp's Q4_0 rounding: d = the largest-magnitude weight / -8, q = min(15, trunc(w / d + 8.5))."""
    b = w.reshape(-1, 32)
    m = b.gather(1, b.abs().argmax(1, keepdim=True))
    d = m / -8
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    q = (b * inv + 8.5).trunc().clamp(0, 15)
    return ((q - 8) * d).reshape(w.shape)


def q3(w: torch.Tensor, search: bool) -> torch.Tensor:
    """Symmetric 3 bits a weight, q in -4..3: d = the largest-magnitude weight / -4 (the extreme lands on
    -4 exactly); with search, the d among 16 scalings of it whose rounding leaves the least squared error."""
    b = w.reshape(-1, 32)
    m = b.gather(1, b.abs().argmax(1, keepdim=True))
    best, err = None, None
    for s in ([1.0] if not search else [1.0 - 0.03 * i for i in range(16)] + [1.05, 1.1]):
        d = m / (-4 * s)
        inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        y = (b * inv).round().clamp(-4, 3) * d
        e = ((y - b) ** 2).sum(1, keepdim=True)
        if best is None:
            best, err = y, e
        else:
            better = e < err
            best, err = torch.where(better, y, best), torch.where(better, e, err)
    return best.reshape(w.shape)


def width(kind: str, name: str, qtype: int) -> int | None:
    """The bits tensor `name` (GGUF type qtype) gets in encoding `kind` (without -rmse): 4, 3, or None
    (as the file has it)."""
    four = 4 if qtype in FOUR_BIT else None  # --draft-bits 4's rule
    head = name in ("output.weight", "token_embd.weight")
    if kind == "file":
        return None
    if kind == "q4" or (head and kind != "q3-kh"):  # the LM head stays 4-bit
        return four
    if kind == "q3-gu":
        return 3 if four and (".ffn_gate." in name or ".ffn_up." in name) else four
    if kind in ("q3-k", "q3-kh") and qtype == Q4_K:
        return None
    return 3


def encode(kind: str, name: str, qtype: int, w: torch.Tensor) -> torch.Tensor:
    bits = width(kind.removesuffix("-rmse"), name, qtype)
    if bits is None or w.dim() != 2 or w.shape[1] % 32:
        return w
    return q4_0(w) if bits == 4 else q3(w, search=kind.endswith("-rmse"))


def step_bytes(gguf, kind: str) -> float:
    """MB one draft step reads: every layer weight and the LM head's first VOCAB rows, in this encoding."""
    total = 0.0
    for name, t in gguf.tensors.items():
        if not name.endswith(".weight") or len(t.dims) != 2:
            continue
        if name == "token_embd.weight" and "output.weight" in gguf.tensors:
            continue  # only a lookup
        head = name in ("output.weight", "token_embd.weight")
        K, rows = t.dims[0], (VOCAB if head else t.dims[1])
        bits = width(kind.removesuffix("-rmse"), name, t.ggml_type)
        total += rows * K * (STORED_BITS[bits] if bits else 8 * t.nbytes / (t.dims[0] * t.dims[1])) / 8
    return total / 1e6


def answers(dataset: str | None, limit: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the target's greedy answer ids) per prompt: plain decoding on our kernels, cached."""
    path = specdec_home() / "sim" / f"answers-{Path(dataset).stem if dataset else 'code'}-{limit}.json"
    if path.exists():
        return [tuple(x) for x in json.loads(path.read_text())]
    target = load_model(TARGET)
    eos = target.eos_ids
    prompts = load_prompts(dataset)[:limit] if dataset else load_prompts()[:limit]
    engine = Engine.single(target.module, NoDrafter(), 4096)
    out = []
    for p in prompts:
        ids = encode_messages(target.tokenizer, [{"role": "user", "content": p.turns[0]}])
        res = engine.generate(ids, GenerationConfig(NEW, 1), eos)
        out.append((ids, list(res.tokens)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    return out


@torch.inference_mode()
def agreement(model, pairs) -> tuple[int, int]:
    hit = n = 0
    for prompt, answer in pairs:
        ids = prompt + answer
        cache = model.new_cache(len(ids) + 1)
        logits = model(torch.tensor([ids[:-1]]), cache, 0)[0, len(prompt) - 1:, :VOCAB]
        pick = logits.argmax(-1)
        hit += int((pick == torch.tensor(answer)).sum())
        n += len(answer)
    return hit, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encodings", default="file,q4,q3,q3-k,q3-gu")
    ap.add_argument("--dataset", default=None, help="a JSONL of prompts (default: the shipped code prompts)")
    ap.add_argument("--limit", type=int, default=10)
    args = ap.parse_args()
    if args.limit < 1:
        ap.error(f"--limit must be >= 1, got {args.limit}")
    kinds = args.encodings.split(",")
    if bad := [k for k in kinds if k.removesuffix("-rmse") not in KINDS or k in ("file-rmse", "q4-rmse")]:
        ap.error(f"unknown encodings {bad}; choose from {', '.join(KINDS)} (a 3-bit one may end in -rmse)")
    pairs = answers(args.dataset, args.limit)
    gguf = loading.open_gguf(resolve_model(DRAFT))
    cfg = gguf_config.gguf_hf_config(gguf)
    plain = loading.dequantize
    for kind in kinds:
        loading.dequantize = lambda g, name, c, kind=kind: encode(kind, name, g.tensors[name].ggml_type,
                                                                  plain(g, name, c))
        model = loading._assemble(cfg, loading.gguf_state_dict(gguf, cfg), torch.device("cpu"), "sim")
        loading.dequantize = plain
        hit, n = agreement(model, pairs)
        print(json.dumps({"encoding": kind, "agree": round(hit / n, 4), "positions": n,
                          "step_mb": round(step_bytes(gguf, kind), 1)}), flush=True)


if __name__ == "__main__":
    main()
