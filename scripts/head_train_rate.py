"""How fast does this machine make a head? Tokens per second of each stage of `specdec train-head` on the
target: extraction (one read of a 512-token chunk), self-generation (greedy answers one row at a time
against SELF_BATCH rows in one batched cache, features and top-k included), and training steps of the
EAGLE head (fp32 against bf16 autocast, one and two unrolled steps) on synthetic records of the real shapes.

    python scripts/head_train_rate.py [--model qwen2.5-coder-1.5b-instruct] > runs/head-train-rate.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from specdec.heads.modules import build_head, eagle_config, target_parts
from specdec.model import load_model
from specdec.training.extract import SELF_BATCH, ChunkRecord, answer_records, teacher
from specdec.training.train import Trainer, TrainConfig
from specdec.training.vocab import select_vocab, token_counts


def text_ids(tokenizer, n: int) -> list[int]:
    source = Path(argparse.__file__).read_text()  # the standard library's own source: text that exists here
    return tokenizer.encode(source, add_special_tokens=False)[:n]


def generation_rate(module, ids: list[int], batch: int, eos: set[int], answers: int, max_new: int) -> float:
    prompts = [(f"p{i}", ids[i * 48:(i + 1) * 48]) for i in range(answers)]
    t0 = time.perf_counter()
    records = list(answer_records(module, iter(prompts), 48, max_new, eos, 32, batch=batch))
    return sum(r.tokens.numel() for r in records) / (time.perf_counter() - t0)


def training_rates(lm, steps: int) -> dict:
    cfg_t, g = lm.module.config, torch.Generator().manual_seed(0)
    recs = [ChunkRecord(f"r{i}", torch.randint(0, 30000, (512,), generator=g),
                        torch.randn(512, cfg_t.hidden_size, generator=g).bfloat16(),
                        torch.randint(0, 30000, (512, 32), generator=g).int(), torch.rand(512, 32, generator=g).half())
            for i in range(4)]
    vocab = select_vocab(token_counts((r.tokens.tolist() for r in recs), cfg_t.vocab_size), 32768, lm.eos_ids)
    out = {}
    for bf16 in (False, True):
        for unroll in (1, 2):
            head = build_head(eagle_config(cfg_t, vocab.size, 2048, 512))
            head.d2t.copy_(vocab.d2t())
            head.t2d.copy_(vocab.t2d(cfg_t.vocab_size))
            trainer = Trainer(head, target_parts(lm.module, vocab.ids),
                              TrainConfig(lr=1e-3, batch_tokens=1024, unroll=unroll, bf16=bf16),
                              Path(tempfile.mkdtemp()), {})
            trainer.train_step(recs[:2], 100)  # warm-up
            t0 = time.perf_counter()
            for s in range(steps):
                trainer.train_step(recs[2 * (s % 2):2 * (s % 2) + 2], 100)
            out[f"{'bf16' if bf16 else 'fp32'}_unroll{unroll}"] = 1024 * steps / (time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--answers", type=int, default=32, help="answers generated per batch setting")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3, help="timed training steps per setting")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, progress=lambda *a, **k: None)
    ids = text_ids(lm.tokenizer, max(512, 48 * args.answers))
    teacher(lm.module, ids[:512], 32)  # warm-up
    t0 = time.perf_counter()
    teacher(lm.module, ids[:512], 32)
    extract = 512 / (time.perf_counter() - t0)
    never = set()  # no end token: every answer runs to --max-new, so both settings make the same tokens
    result = {"model": args.model, "threads": args.threads, "extract_tok_s": extract,
              "self_generate_tok_s": {"1": generation_rate(lm.module, ids, 1, never, args.answers // 4, args.max_new),
                                      str(SELF_BATCH): generation_rate(lm.module, ids, SELF_BATCH, never,
                                                                       args.answers, args.max_new)},
              "train_tok_s": training_rates(lm, args.steps)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
