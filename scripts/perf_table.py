"""Collect the engine-speed evidence (issue 4) into one JSON and a markdown table.

Usage:
  python scripts/perf_table.py --profiles runs/perf --e2e-before docs/results/core.json \
      --e2e-after docs/results/peers.json --out docs/results/perf.json

Reads `specdec profile` JSONs named before-1.5b / after-1.5b / before-0.5b / after-0.5b, or
alternated runs before-1.5b-N / after-1.5b-N (session 5: before --no-pack, MKL for every GEMM, after
oneDNN-prepacked weights for multi-row GEMMs; session 9: before --no-kernel, after our kernel), bf16-1.5b, and
bf16-packed-1.5b and bf16ab-{packed,aten}-N (bf16 with every GEMM prepacked vs ATen, alternated), omp-default-N / omp-active-N (the OMP_WAIT_POLICY
trial), weight-stream.json (scripts/weight_stream_bench.py), plus two bench summaries on the code prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def profile_row(p: dict) -> dict:
    v = p["verify_cost"]
    return {"plain_tokens_per_second": p["plain_tokens_per_second"], "bandwidth_gbs": p["bandwidth_gbs"],
            "roofline_tokens_per_second": p["roofline_tokens_per_second"], "roofline_fraction": p["roofline_fraction"],
            "v5": v.get("5"), "v9": v.get("9"), "verify_cost": v, "draft_cost_ratio": p.get("draft_cost_ratio")}


def e2e_row(summary: dict) -> dict:
    out = {}
    for method, m in summary["methods"].items():
        out[method] = {"tokens_per_second": m["tokens_per_second_total"],
                       "speedup_vs_plain_mean": m.get("speedup_vs_plain_mean"), "tau": m.get("tau"),
                       "greedy_mismatches": len(m.get("greedy_mismatches") or [])}
    return {"config": {k: summary["config"].get(k) for k in ("prompts", "max_new_tokens", "k", "draft_vocab", "dataset")},
            "methods": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profiles", default="runs/perf")
    ap.add_argument("--e2e-before", default="docs/results/core.json")
    ap.add_argument("--e2e-after", default="docs/results/peers.json")
    ap.add_argument("--out", default="docs/results/perf.json")
    args = ap.parse_args()
    d = Path(args.profiles)
    result = {"models": {}}
    for model in ("1.5b", "0.5b"):
        entry = {}
        for when in ("before", "after"):
            # one profile (before-1.5b.json) or alternated ones (before-1.5b-1.json, ...): the table
            # shows the run of median roofline fraction, and every run is kept under "runs"
            runs = [load(d / f"{when}-{model}.json")] if (d / f"{when}-{model}.json").exists() else \
                [load(p) for p in sorted(d.glob(f"{when}-{model}-*.json"))]
            rows = [profile_row(r) for r in runs if r]
            pick = sorted(rows, key=lambda r: r["roofline_fraction"])[(len(rows) - 1) // 2] if rows else None
            entry[when] = dict(pick, runs=rows) if pick and len(rows) > 1 else pick
        result["models"][model] = entry
    for name in ("bf16-1.5b", "bf16-packed-1.5b"):
        bf16 = load(d / f"{name}.json")
        result[name.replace("-", "_")] = profile_row(bf16) if bf16 else None
    omp = {}
    for policy in ("default", "active"):
        runs = [load(p) for p in sorted(d.glob(f"omp-{policy}-*.json"))]
        if runs:
            omp[policy] = {"plain_tokens_per_second": [r["plain_tokens_per_second"] for r in runs],
                           "roofline_fraction": [r["roofline_fraction"] for r in runs],
                           "median_roofline_fraction": statistics.median(r["roofline_fraction"] for r in runs)}
    result["omp_wait_policy"] = omp
    ab = {}
    for kernel in ("packed", "aten"):  # bf16, every GEMM prepacked vs ATen's, alternated
        runs = [load(p) for p in sorted(d.glob(f"bf16ab-{kernel}-*.json"))]
        if runs:
            ab[kernel] = [profile_row(r) for r in runs]
    result["bf16_packed_vs_aten"] = ab
    stream = load(d / "weight-stream.json")
    result["weight_stream"] = stream
    for key, path in (("before", args.e2e_before), ("after", args.e2e_after)):
        s = load(Path(path))
        result.setdefault("end_to_end", {})[key] = e2e_row(s) if s else None
    Path(args.out).write_text(json.dumps(result, indent=1))
    rows = ["| | 1.5B before | 1.5B after | 0.5B before | 0.5B after |", "|---|---|---|---|---|"]
    m = result["models"]

    def cell(model, when, key, fmt="{}"):
        r = m[model][when]
        return fmt.format(r[key]) if r and r.get(key) is not None else "-"
    for label, key, fmt in (("plain tok/s", "plain_tokens_per_second", "{}"),
                            ("roofline tok/s", "roofline_tokens_per_second", "{}"),
                            ("fraction of roofline", "roofline_fraction", "{:.0%}"),
                            ("v(5)", "v5", "{}"), ("v(9)", "v9", "{}"), ("c (draft / target step)", "draft_cost_ratio", "{}")):
        rows.append(f"| {label} | " + " | ".join(cell(mo, w, key, fmt) for mo in ("1.5b", "0.5b")
                                               for w in ("before", "after")) + " |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
