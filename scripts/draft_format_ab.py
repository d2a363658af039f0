"""Does re-encoding the draft model's blocks at load (loading.FASTER_FORMATS: Q5_0 -> Q8_0, the same
weights) make its decode step cheaper? Loads the draft both ways and the target once, then times
one-token steps of each, interleaved round by round, with the draft's head cut to --draft-vocab rows
as the engine runs it. c = a draft step over a target step. Prints JSON.

Usage: python scripts/draft_format_ab.py [--draft qwen2.5-coder-0.5b-instruct] [--rounds 7] > runs/draft-format.json
"""

import argparse
import json
import statistics
import time

import torch

from specdec.drafters.draft_model import truncated_head
from specdec.model.gguf_file import GGUFFile
from specdec.model.loading import load_gguf_blocks
from specdec.model.registry import pull


def step_seconds(model, context: int, steps: int) -> float:
    """Median seconds of a one-token step after `context` cached positions."""
    cache = model.new_cache(context + steps + 1)
    with torch.inference_mode():
        model(torch.randint(0, 1000, (1, context)), cache, 0)
        ts = []
        for i in range(steps):
            t0 = time.perf_counter()
            model(torch.tensor([[i + 1]]), cache, context + i)
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--draft-vocab", type=int, default=32768)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=16, help="timed steps per round (median)")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    target = load_gguf_blocks(GGUFFile(pull(args.model)))
    drafts = {"as stored": load_gguf_blocks(GGUFFile(pull(args.draft))),
              "re-encoded": load_gguf_blocks(GGUFFile(pull(args.draft)), reencode=True)}
    drafts = {k: truncated_head(m, args.draft_vocab) for k, m in drafts.items()}
    models = {"target": target, **drafts}
    times: dict[str, list[float]] = {k: [] for k in models}
    for r in range(args.rounds):
        order = list(models)[r % 3:] + list(models)[:r % 3]
        for name in order:
            times[name].append(step_seconds(models[name], args.context, args.steps))
    out = {"model": args.model, "draft": args.draft, "draft_vocab": args.draft_vocab, "context": args.context,
           "rounds": args.rounds, "threads": torch.get_num_threads(), "step_ms": {}, "c": {}}
    for name, ts in times.items():
        out["step_ms"][name] = round(1e3 * statistics.median(ts), 3)
    for name in drafts:  # c per round (the draft against the target of the same round), then the median
        out["c"][name] = round(statistics.median(d / t for d, t in zip(times[name], times["target"])), 4)
    out["re_encoded_over_stored"] = round(statistics.median(
        a / b for a, b in zip(times["re-encoded"], times["as stored"])), 4)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
