"""What llama.cpp's infill sampler adds to a verify step's sampling: probs_from_logits on 5-row blocks of a
real model's rows (Qwen2.5-Coder-0.5B's logits over the last 40 positions of a FIM prompt and its middle),
llama.vscode's settings (top-k 40, top-p 0.99) with and without the infill sampler, taking turns; and the
same on random rows (flat: every text token under 0.2, so every row falls back to its end token).

  SPECDEC_HOME=... python docs/results/raw/infill-sampler-cost-zen4/cost.py --out cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from specdec.config import SamplingParams  # noqa: E402
from specdec.constraints.vocab import Vocabulary  # noqa: E402
from specdec.model import load_model  # noqa: E402
from specdec.model.registry import pull  # noqa: E402
from specdec.model.tokenizer import encode_infill  # noqa: E402
from specdec.sampling.logits import probs_from_logits  # noqa: E402
from specdec.server.llama_api import infill_vocabulary  # noqa: E402

ROOT = Path(__file__).resolve().parents[4]


def ms_per_block(blocks: list[torch.Tensor], params: SamplingParams, repeats: int = 5) -> float:
    t0 = time.perf_counter()
    for _ in range(repeats):
        for block in blocks:
            probs_from_logits(block, params)
    return (time.perf_counter() - t0) / (repeats * len(blocks)) * 1000


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("cost.json"))
    args = p.parse_args()
    torch.set_num_threads(2)
    m = load_model(str(pull(args.model)), device="cpu", progress=lambda x: None)
    tok, size = m.tokenizer, m.module.config.vocab_size
    vocab = infill_vocabulary(Vocabulary.build(tok, size, sorted(m.eos_ids)).tokenizer, m.eos_ids, tok.eos_token_id)
    case = json.loads((ROOT / "docs/results/prompts/fim20.jsonl").read_text().splitlines()[0])
    ids = encode_infill(tok, case["prompt"], case["suffix"]) + tok.encode(case["middle"], add_special_tokens=False)[:40]
    with torch.inference_mode():
        real = m.module(torch.tensor([ids]), m.module.new_cache(len(ids) + 1), 0)[0, -40:].float()  # [40, vocab]
    flat = torch.randn(40, size, generator=torch.Generator().manual_seed(0)) * 3
    with_infill = SamplingParams(1.0, 40, 0.99, order=("top_k", "top_p", "infill", "min_p", "temperature"),
                                 infill_vocab=vocab)
    without = SamplingParams(1.0, 40, 0.99, order=("top_k", "top_p", "min_p", "temperature"))
    out = {}
    for name, rows in (("real FIM rows", real), ("random flat rows", flat)):
        blocks = [rows[i:i + 5] for i in range(0, 40, 5)]
        runs = {"without": [], "with infill": []}
        for _ in range(args.rounds):
            for setup, params in (("without", without), ("with infill", with_infill)):
                runs[setup].append(ms_per_block(blocks, params))
        out[name] = {setup: round(statistics.median(v), 3) for setup, v in runs.items()}
        out[name]["added_ms"] = round(out[name]["with infill"] - out[name]["without"], 3)
        print(name, out[name], flush=True)
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "ms per 5-row block (median of rounds)": out},
                                   indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
