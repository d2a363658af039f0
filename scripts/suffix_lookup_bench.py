"""Per-step lookup time of the suffix drafter over a large datastore.

Builds a datastore of at least --tokens tokens from Python standard-library sources (sorted file
order, so the corpus is the same on every machine with the same Python), then replays held-out
files (never in the datastore) token by token through SuffixDrafter.propose, as a generation would:
each step indexes the new token in the request's own automaton, advances the cache and datastore
matches, and proposes up to --k tokens. Prints JSON with the per-step time distribution.

    python scripts/suffix_lookup_bench.py --model qwen2.5-coder-1.5b-instruct --tokens 1000000 \
        > runs/suffix-lookup.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
import time
from pathlib import Path

from specdec.config import SamplingParams
from specdec.datastore import build_datastore, tokenizer_fingerprint
from specdec.drafters.base import DraftState
from specdec.drafters.suffix import SuffixDrafter
from specdec.model.registry import resolve_model
from specdec.model.tokenizer import load_tokenizer


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "test" not in p.parts and "site-packages" not in p.parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="whose tokenizer to use")
    ap.add_argument("--tokens", type=int, default=1_000_000, help="datastore size, at least")
    ap.add_argument("--held-out", type=int, default=5, help="files replayed as generations")
    ap.add_argument("--steps", type=int, default=2000, help="steps timed per held-out file, at most")
    ap.add_argument("--k", type=int, default=8)
    args = ap.parse_args()

    tokenizer = load_tokenizer(resolve_model(args.model))
    files = stdlib_files()
    held_out = files[:: max(len(files) // args.held_out, 1)][: args.held_out]
    docs, total = [], 0
    for path in files:
        if total >= args.tokens:
            break
        if path in held_out:
            continue
        ids = tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False)
        docs.append(ids)
        total += len(ids)
    t0 = time.perf_counter()
    store = build_datastore(docs, tokenizer_fingerprint(tokenizer))
    build_s = time.perf_counter() - t0

    times, lengths = [], []
    drafter = SuffixDrafter(datastore=store)
    for path in held_out:
        ids = tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False)
        ids = ids[: args.steps + 1]
        drafter.start(ids[:1])
        for i in range(1, len(ids)):
            state = DraftState(ids[:i], args.k, SamplingParams(), None)
            t = time.perf_counter()
            tree = drafter.propose(state)
            times.append(time.perf_counter() - t)
            lengths.append(len(tree))
    times_us = sorted(t * 1e6 for t in times)
    pct = lambda q: round(times_us[min(int(q * len(times_us)), len(times_us) - 1)], 1)  # noqa: E731
    out = {
        "datastore_tokens": store.num_tokens, "datastore_documents": store.num_documents,
        "automaton_states": len(store.automaton.length),
        "build_seconds": round(build_s, 2), "held_out_files": [str(p.name) for p in held_out],
        "steps": len(times_us), "k": args.k,
        "lookup_us": {"median": round(statistics.median(times_us), 1), "p90": pct(0.90), "p99": pct(0.99),
                      "max": round(times_us[-1], 1), "mean": round(statistics.fmean(times_us), 1)},
        "mean_proposed_tokens": round(statistics.fmean(lengths), 3),
        "python": sys.version.split()[0],
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
