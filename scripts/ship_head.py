"""Copy a trained head into the repository's heads/ directory, its weights in bf16 (half the size;
load_head reads them back into float32), so that a fresh checkout drafts with it without training.

Usage: python scripts/ship_head.py ~/.cache/specdec/heads/qwen2.5-coder-1.5b-instruct-eagle-200k \
    --name qwen2.5-coder-1.5b-instruct-eagle
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from specdec.errors import SpecdecError
from specdec.heads.checkpoint import META, load_head, save_head
from specdec.heads.find import SHIPPED_HEADS

LIMIT_MB = 50


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("head", help="a head directory (written by specdec train-head)")
    ap.add_argument("--name", required=True, help="its name under heads/: MODEL-KIND is what --head auto finds")
    args = ap.parse_args()
    try:
        head, meta = load_head(Path(args.head))
    except SpecdecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if "target" not in meta:
        print(f"error: {args.head} is not a head trained by specdec train-head (no {META})", file=sys.stderr)
        return 2
    out = save_head(head, SHIPPED_HEADS / args.name, meta["target"],
                    {k: v for k, v in meta.items() if k not in ("format", "kind", "head_config", "target")},
                    dtype=torch.bfloat16)
    size = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    print(json.dumps({"head": str(out), "mb": round(size, 1), "meta": json.loads((out / META).read_text())}))
    if size > LIMIT_MB:
        print(f"{out} is {size:.1f} MB, over the {LIMIT_MB} MB a committed head may take", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
