"""The same `specdec bench` in this checkout and in another (a `git worktree` of an older commit),
run as separate processes in the order new, old, old, new, so slow drift of the host hits both
alike. Writes one raw JSON: the command, each run's records (prompt, method, seconds, tokens) and a
row per method: tok/s over all prompts (mean of a side's runs), new / old, and the prompts whose
greedy tokens are the same in every run of both sides.

Usage: python scripts/checkout_ab.py --old /tmp/old --out docs/results/raw/step-ab.json -- \
    --model qwen2.5-coder-1.5b-instruct --methods plain,draft,ngram --k 2 --limit 7 --max-new-tokens 64
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def bench(checkout: Path, bench_args: list[str], out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "specdec.cli", "bench", *bench_args, "--no-plots", "--out", str(out)]
    subprocess.run(cmd, cwd=checkout, check=True, stdout=subprocess.DEVNULL)  # `python -m` imports checkout's package
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    return [{k: r[k] for k in ("prompt_id", "method", "seconds", "tokens")} for r in rows]


def summarize(runs: dict[str, list[dict]]) -> list[dict]:
    methods = sorted({r["method"] for rs in runs.values() for r in rs})
    rows = []
    for m in methods:
        speed = {side: statistics.mean(sum(len(r["tokens"]) for r in rs if r["method"] == m) /
                                       sum(r["seconds"] for r in rs if r["method"] == m)
                                       for name, rs in runs.items() if name.startswith(side))
                 for side in ("new", "old")}
        outputs: dict[str, set] = {}
        for rs in runs.values():
            for r in rs:
                if r["method"] == m:
                    outputs.setdefault(r["prompt_id"], set()).add(tuple(r["tokens"]))
        same = sum(len(v) == 1 for v in outputs.values())
        rows.append({"method": m, "old_tok_s": round(speed["old"], 2), "new_tok_s": round(speed["new"], 2),
                     "new_over_old": round(speed["new"] / speed["old"], 3), "same_tokens": f"{same}/{len(outputs)}"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the other checkout (e.g. `git worktree add /tmp/old COMMIT`)")
    ap.add_argument("--order", default="new,old,old,new")
    ap.add_argument("--out", required=True, help="the raw JSON to write")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: the bench's arguments")
    args = ap.parse_args()
    bench_args = [a for a in args.bench_args if a != "--"]
    if not (Path(args.old) / "specdec" / "cli.py").is_file():
        sys.exit(f"checkout_ab: {args.old} is not a specdec checkout (no specdec/cli.py); make one with "
                 "`git worktree add DIR COMMIT`")
    if not bench_args:
        sys.exit("checkout_ab: give the bench's arguments after --")
    runs, seen = {}, {"new": 0, "old": 0}
    with tempfile.TemporaryDirectory() as tmp:
        for side in args.order.split(","):
            seen[side] += 1
            name = f"{side}-{seen[side]}"
            print(f"run {name}", file=sys.stderr)
            runs[name] = bench(HERE if side == "new" else Path(args.old), bench_args, Path(tmp) / name)
    result = {"command": "specdec bench " + " ".join(bench_args) + f" --no-plots (new: this checkout, old: "
              f"{args.old}; order {args.order})", "rows": summarize(runs), "runs": runs}
    Path(args.out).write_text(json.dumps(result))
    print(json.dumps(result["rows"], indent=1))


if __name__ == "__main__":
    main()
