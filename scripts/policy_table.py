"""The adaptive policy against plain decoding and the best fixed k, per category, from a bench summary.

    python scripts/policy_table.py runs/policy2-greedy/summary.json [--adaptive draft:auto,hybrid:auto] [--matrix]
    python scripts/policy_table.py runs/policy13-t07-auto/summary.json --fixed-from runs/policy12-t07/summary.json

Speedups are the bench's mean of per-prompt ratios against plain decoding in the same run. The
fixed-k methods are those of the same kind as the adaptive one with a pinned k ('draft:1'..'draft:8');
--fixed-from reads them from another run of the same prompts (each speedup over its own run's plain).
"""

from __future__ import annotations

import argparse
import json


def rows(summary: dict, adaptive: str, fixed_kind: str, fixed_from: dict | None = None) -> list[list[str]]:
    scopes = [("all", summary["methods"])] + sorted(summary["categories"].items())
    other = fixed_from or summary
    others = {"all": other["methods"], **other["categories"]}
    out = []
    for name, methods in scopes:
        a = methods.get(adaptive)
        fixed = {label: m for label, m in others.get(name, {}).items()
                 if m.get("kind") == fixed_kind and not m.get("adaptive")}
        if a is None or not fixed:
            continue
        best_label, best = max(fixed.items(), key=lambda kv: kv[1]["speedup_vs_plain_mean"])
        ratio = a["speedup_vs_plain_mean"] / best["speedup_vs_plain_mean"]
        out.append([name, f"{a['speedup_vs_plain_mean']:.3f}x", f"{best_label.split(':')[-1]} "
                    f"{best['speedup_vs_plain_mean']:.3f}x", f"{ratio:.3f}", f"{a['tau']:.2f}",
                    f"{100 * a['plain_fraction']:.0f}%"])
    return out


def matrix(summary: dict) -> list[str]:
    """Every method's mean speedup over plain, overall and per category (markdown lines)."""
    labels = list(summary["methods"])
    scopes = [("all", summary["methods"])] + sorted(summary["categories"].items())
    out = ["| scope | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for name, methods in scopes:
        cells = [f"{methods[m]['speedup_vs_plain_mean']:.3f}" if m in methods else "-" for m in labels]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("summary")
    ap.add_argument("--adaptive", default="draft:auto", help="comma list of adaptive method labels")
    ap.add_argument("--fixed-kind", default="draft", help="the kind whose pinned-k methods are compared")
    ap.add_argument("--matrix", action="store_true", help="also every method's speedup per category")
    ap.add_argument("--fixed-from", help="read the fixed-k methods from this summary (another run of the same prompts)")
    args = ap.parse_args()
    summary = json.load(open(args.summary))
    fixed_from = json.load(open(args.fixed_from)) if args.fixed_from else None
    if args.matrix:
        print("\n".join(matrix(summary)))
    for label in args.adaptive.split(","):
        print(f"\n{label} against plain decoding and the best fixed k of {args.fixed_kind}:\n")
        print("| scope | adaptive vs plain | best fixed k | adaptive / best fixed | adaptive tau | plain steps |")
        print("|---|---|---|---|---|---|")
        for r in rows(summary, label, args.fixed_kind, fixed_from):
            print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
