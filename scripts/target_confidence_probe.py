"""Does the target's confidence on its own plain tokens predict the draft's acceptance, per prompt?

Backs the policy's target signal (AdaptivePolicy.observe_target). For each prompt of a bench run's
plain records (turn 1 only), both models read the prompt and the target's own answer in one
forward (teacher-forced). Per answer position: the target's top probability, whether the draft's
argmax matches the target's (greedy acceptance given the chain got there), and at T = 0.7 the
acceptance chance sum(min(p, q)) with its top probability. A calibration table (per bin of the
target's top probability, the mean acceptance over all prompts, in-sample) turns each prompt's
first N confidences into a predicted acceptance; printed: its correlation with the prompt's real
rate, per N. Prints JSON.

Usage: python scripts/target_confidence_probe.py docs/results/raw/policy-greedy/records.jsonl > runs/target-confidence.json
"""

import argparse
import json
import sys

import numpy as np
import torch

from specdec.model import load_model
from specdec.model.tokenizer import encode_messages
from specdec.policy import CONF_EDGES

EDGES = np.array(CONF_EDGES[:-1] + (1.0001,))


def per_token(records: str, prompts: str, target_name: str, draft_name: str, draft_vocab: int) -> list[dict]:
    turns = {json.loads(line)["id"]: json.loads(line)["turns"][0] for line in open(prompts)}
    target = load_model(target_name, progress=lambda *a: None)
    draft = load_model(draft_name, progress=lambda *a: None)
    out, seen = [], set()
    for line in open(records):
        r = json.loads(line)
        if r["method"] != "plain" or r["prompt_id"] in seen or r["prompt_id"] not in turns:
            continue
        seen.add(r["prompt_id"])
        ids = encode_messages(target.tokenizer, [{"role": "user", "content": turns[r["prompt_id"]]}])
        n = r["stats"][0]["new_tokens"]
        x = torch.tensor([ids + r["tokens"][:n]])
        with torch.inference_mode():
            rows = slice(len(ids) - 1, -1)  # the rows that predict the answer's tokens
            tl = target.module(x, target.module.new_cache(x.shape[1] + 1), 0)[0, rows].float()
            dl = draft.module(x, draft.module.new_cache(x.shape[1] + 1), 0)[0, rows, :draft_vocab or None].float()
        v = dl.shape[-1]
        t7, d7 = (tl / 0.7).softmax(-1), (dl / 0.7).softmax(-1)
        out.append({"id": r["prompt_id"], "category": r["category"], "tokens": n,
                    "greedy": {"top": tl.softmax(-1).amax(-1).tolist(), "accept": (tl.argmax(-1) == dl.argmax(-1)).float().tolist()},
                    "t07": {"top": t7.amax(-1).tolist(), "accept": torch.minimum(t7[:, :v], d7).sum(-1).tolist()}})
        print(r["prompt_id"], file=sys.stderr)
    return out


def analyse(rows: list[dict], mode: str) -> dict:
    top = np.concatenate([r[mode]["top"] for r in rows])
    acc = np.concatenate([r[mode]["accept"] for r in rows])
    bins = np.digitize(top, EDGES) - 1
    table = np.array([acc[bins == b].mean() if (bins == b).any() else np.nan for b in range(len(EDGES) - 1)])
    out = {"calibration": {f"{EDGES[b]:.2f}-{min(EDGES[b + 1], 1):.2f}": [None if np.isnan(table[b]) else round(float(table[b]), 3),
                                                                             int((bins == b).sum())]
                           for b in range(len(EDGES) - 1)}, "by_first_n": {}}
    for n in (4, 8, 16, 32, 64):
        pred = [float(np.nanmean(table[np.digitize(r[mode]["top"][:n], EDGES) - 1])) for r in rows]
        real = [float(np.mean(r[mode]["accept"])) for r in rows]
        out["by_first_n"][n] = {"corr": round(float(np.corrcoef(pred, real)[0, 1]), 3),
                                "predicted_vs_real": {r["id"]: [round(p, 3), round(q, 3)] for r, p, q in zip(rows, pred, real)}}
    out["per_prompt_mean_top_vs_accept"] = {r["id"]: [r["category"], round(float(np.mean(r[mode]["top"])), 3),
                                                      round(float(np.mean(r[mode]["accept"])), 3)] for r in rows}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", help="a bench run's records.jsonl with plain records")
    ap.add_argument("--prompts", default="docs/results/prompts/policy.jsonl")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--draft-vocab", type=int, default=32768)
    args = ap.parse_args()
    rows = per_token(args.records, args.prompts, args.model, args.draft, args.draft_vocab)
    print(json.dumps({"records": args.records, "target": args.model, "draft": args.draft, "draft_vocab": args.draft_vocab,
                      "greedy": analyse(rows, "greedy"), "t07": analyse(rows, "t07")}, indent=1))


if __name__ == "__main__":
    main()
