"""Fill-in-the-middle tasks from Python source, as an editor's completion asks for them: a gap of whole
lines inside a file, the text before it as the prompt, the text after it as the suffix, the removed
lines as `middle` (the reference). Deterministic for a given source tree, seed and count.

Each task's gap is 1..--max-lines lines starting on an indented, non-blank line (inside a function or
a class) at least 10 lines into the file; the prompt keeps the last --prefix-chars characters before
the gap and the suffix the first --suffix-chars after it, both cut at line boundaries. Files are drawn
at random (without replacement while any is left) from those with 60 lines or more.

Usage: python scripts/fim_set.py --source specdec --n 20 --seed 0 --out runs/fim.jsonl
(then `specdec bench --dataset runs/fim.jsonl --methods plain,draft,ngram`)
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def task(path: Path, root: Path, rng: random.Random, max_lines: int, prefix_chars: int, suffix_chars: int):
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    starts = [i for i in range(10, len(lines) - 5) if lines[i].startswith((" ", "\t")) and lines[i].strip()]
    if not starts:
        return None
    start = rng.choice(starts)
    end = min(len(lines), start + rng.randint(1, max_lines))
    before, after = lines[:start], lines[end:]
    prefix, n = [], 0
    for line in reversed(before):  # whole lines, up to prefix_chars
        if n + len(line) > prefix_chars and prefix:
            break
        prefix.insert(0, line)
        n += len(line)
    suffix, n = [], 0
    for line in after:
        if n + len(line) > suffix_chars and suffix:
            break
        suffix.append(line)
        n += len(line)
    name = path.relative_to(root).as_posix()
    return {"id": f"fim-{name}:{start + 1}", "category": "fim", "prompt": "".join(prefix),
            "suffix": "".join(suffix), "middle": "".join(lines[start:end])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True, help="a folder of Python files (searched recursively)")
    ap.add_argument("--n", type=int, default=20, help="tasks to make")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-lines", type=int, default=6, help="the longest gap, in lines")
    ap.add_argument("--prefix-chars", type=int, default=2000)
    ap.add_argument("--suffix-chars", type=int, default=600)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    root = Path(args.source)
    files = sorted(p for p in root.rglob("*.py") if len(p.read_text(encoding="utf-8").splitlines()) >= 60)
    if not files:
        raise SystemExit(f"no Python file of 60 lines or more under {root}")
    rng, tasks, pool = random.Random(args.seed), [], []
    while len(tasks) < args.n:
        if not pool:
            pool = list(files)
            rng.shuffle(pool)
        t = task(pool.pop(), root, rng, args.max_lines, args.prefix_chars, args.suffix_chars)
        if t is not None:
            tasks.append(t)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(t) + "\n" for t in tasks))
    print(f"{len(tasks)} tasks from {len(files)} files -> {args.out}")


if __name__ == "__main__":
    main()
