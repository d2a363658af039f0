"""What each drafter would give on a GPU: acceptance measured on the CPU, costs measured on the GPU.

Acceptance does not depend on the hardware (the same files, prompts and greedy tokens), costs do. From a
`specdec bench` run at a fixed k per method (per-position acceptance ppa[i]: the share of steps whose
first i + 1 drafts were all accepted) and a GPU profile (v(n) and the draft's c; `specdec profile` JSON
or scripts/cuda_bench.py's, its graphs mode by default), a chain of k' <= k drafts emits
tau(k') = 1 + sum_{i<k'} ppa[i] tokens per step for v(k' + 1) + k' c plain GPU steps:
speedup = tau / (v(k' + 1) + k' c), decode only (prefill excluded). Trees: the run's tau for
v(nodes + 1) + depth c (one draft forward per depth). The cost of a draft token c: the draft model's
step (draft, hybrid, tree) or the head's (eagle, eagle-tree: needs head_cost_ratio in the profile), for
chains the device chain's per token where cuda_bench.py timed it (chain_cost_ratio_device,
head_chain_cost_ratio_device), for a head's tree the device tree's whole cost where timed
(head_tree_cost_ratio_device); a
lookup's (ngram, suffix) is host time, the CPU run's drafting seconds per draft token over the GPU's step.
A hybrid's c is counted for every draft token, lookup's too: an upper bound on its cost.

    python scripts/gpu_predict.py --gpu docs/results/raw/cuda-h200/profile-graphs.json \\
        --acceptance runs/gpu-accept/code runs/gpu-accept/specbench --out runs/gpu-predict.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.policy.costs import interpolate

MODEL_KINDS = {"draft", "hybrid", "tree"}
HEAD_KINDS = {"eagle", "eagle-tree", "eagle-hybrid", "medusa"}
LOOKUP_KINDS = {"ngram", "suffix"}


def read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"gpu_predict: cannot read {what} {path}: {e}")


def gpu_costs(path: Path, mode: str) -> dict:
    """v(n) # {n: cost}, the draft's and the head's c, and the plain step's seconds from a GPU profile."""
    prof = read_json(path, "the GPU profile")
    if "modes" in prof:  # scripts/cuda_bench.py's report
        prof = prof["modes"][mode if mode in prof["modes"] else "eager"]
    if "verify_cost" not in prof or "step_seconds" not in prof:
        raise SystemExit(f"gpu_predict: {path} is not a profile (specdec profile's or cuda_bench.py's JSON): "
                         "no verify_cost or step_seconds")
    draft, head = prof.get("draft_cost_ratio"), prof.get("head_cost_ratio")
    return {"v": {int(n): c for n, c in prof["verify_cost"].items()}, "draft": draft, "head": head,
            # chains are drafted on the device under CUDA graphs: their c is the device chain's, where timed
            "draft_chain": prof.get("chain_cost_ratio_device", draft),
            "head_chain": prof.get("head_chain_cost_ratio_device", head),
            # a head's whole EAGLE-2 tree drafted on the device (budget 16, depth 4, topk 4), in plain steps
            "head_tree": prof.get("head_tree_cost_ratio_device"), "step_seconds": prof["step_seconds"]}


def add(total: list, part: list) -> list:
    return [a + b for a, b in zip(total + [0] * (len(part) - len(total)), part + [0] * (len(total) - len(part)))]


def pooled(records: list[dict]) -> dict:
    """One method's counts over records: steps, tokens, drafted and accepted per position, draft seconds."""
    out = {"steps": 0, "tokens": 0, "drafted": 0, "nodes": 0, "draft_seconds": 0.0, "drafted_at": [], "accepted_at": []}
    for r in records:
        for s in r["stats"]:
            out["steps"] += s["steps"]
            out["tokens"] += sum(s["emitted_per_step"])
            out["drafted"] += s["drafted"]
            out["nodes"] += s["verified_nodes"]
            out["draft_seconds"] += s["draft_seconds"]
            out["drafted_at"] = add(out["drafted_at"], s["drafted_at"])
            out["accepted_at"] = add(out["accepted_at"], s["accepted_at"])
    return out


def draft_token_cost(kind: str, m: dict, gpu: dict) -> float | None:
    """c of one draft token of this kind on the GPU: a tree's is a step's (one forward a depth), a chain's
    the device chain's where the profile timed it."""
    tree = kind.endswith("tree")
    if kind in MODEL_KINDS:
        return gpu["draft" if tree else "draft_chain"]
    if kind in HEAD_KINDS:
        return gpu["head" if tree or kind == "medusa" else "head_chain"]
    if kind in LOOKUP_KINDS and m["drafted"]:
        return m["draft_seconds"] / m["drafted"] / gpu["step_seconds"]
    return None


def capped(m: dict, cap: int, c: float, v: dict) -> float:
    """Decode speedup with drafts cut to `cap` tokens: the tokens a step emits, 1 + sum_{i<cap} A_i / S,
    over its expected cost, sum_j P(min(L, cap) = j) (v(j + 1) + j c), L the drafted length (P(L > i) =
    D_i / S: a lookup drafts fewer tokens than its k where its match is short)."""
    steps, d, a = m["steps"], m["drafted_at"][:cap], m["accepted_at"][:cap]
    reach = [steps] + d  # reach[j]: steps drafting at least j tokens
    cost = sum((reach[j] - (reach[j + 1] if j < len(d) else 0)) / steps * (interpolate(v, j + 1) + j * c)
               for j in range(len(reach)))
    return (1 + sum(a) / steps) / cost


def chain_prediction(m: dict, c: float, v: dict) -> dict:
    """Speedup at the run's k and at the best cap k' <= k (0: plain decoding pays best)."""
    out = {k: capped(m, k, c, v) for k in range(len(m["drafted_at"]) + 1)}
    best = max(out, key=out.get)
    return {"at_k": round(out[len(m["drafted_at"])], 3), "best_k": best, "at_best_k": round(out[best], 3)}


def tree_prediction(m: dict, c: float, v: dict, depth: int, tree_cost: float | None = None) -> dict:
    """A tree's speedup: its tokens a step over the verify of its nodes and its drafting, depth draft
    passes at c each, or tree_cost (a whole tree drafted on the device, in plain steps) where timed."""
    draft = depth * c if tree_cost is None else tree_cost
    speedup = m["tokens"] / m["steps"] / (interpolate(v, m["nodes"] / m["steps"] + 1) + draft)
    return {"at_k": round(speedup, 3), "best_k": None, "at_best_k": round(speedup, 3)}


def predict(records: list[dict], gpu: dict, depth: int, labels: list[str]) -> dict:
    out = {}
    for label in labels:
        runs = [r for r in records if r["method"] == label and not r.get("error") and r.get("stats")]
        if not runs:
            continue
        kind = runs[0]["kind"]
        if kind in ("plain", "none") or runs[0].get("peer") or ":" not in label or label.endswith(":auto"):
            continue  # plain, peers and the policy's own k choices are not a fixed k
        m = pooled(runs)
        c = draft_token_cost(kind, m, gpu)
        if c is None:
            out[label] = {"skipped": f"no GPU cost for a {kind} draft token in the profile"}
            continue
        whole = gpu["head_tree"] if kind == "eagle-tree" else None
        pred = (tree_prediction(m, c, gpu["v"], depth, whole) if kind.endswith("tree")
                else chain_prediction(m, c, gpu["v"]))
        out[label] = {"k": runs[0]["k"], "tau_cpu": round(m["tokens"] / m["steps"], 3), "c_gpu": round(c, 3), **pred}
    return out


def table(result: dict) -> str:
    rows = ["| prompts | method | k | tau (CPU) | c (GPU) | predicted at k | best k | predicted at best k |",
            "|---|---|---|---|---|---|---|---|"]
    for scope, methods in result["predictions"].items():
        for label, p in methods.items():
            if "skipped" in p:
                rows.append(f"| {scope} | {label} | | | | {p['skipped']} | | |")
                continue
            rows.append(f"| {scope} | {label} | {p['k']} | {p['tau_cpu']:.2f} | {p['c_gpu']:.3f} | {p['at_k']:.2f}x | "
                        f"{'-' if p['best_k'] is None else p['best_k']} | {p['at_best_k']:.2f}x |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=Path, required=True, help="a GPU profile JSON (specdec profile or cuda_bench.py)")
    ap.add_argument("--mode", default="graphs", help="cuda_bench.py's mode to read (graphs or eager)")
    ap.add_argument("--acceptance", type=Path, nargs="+", required=True, help="specdec bench output directories")
    ap.add_argument("--draft-c", type=float, help="the draft model's c to assume instead of the profile's (what if)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    gpu = gpu_costs(args.gpu, args.mode)
    if args.draft_c is not None:
        gpu["draft"] = gpu["draft_chain"] = args.draft_c
    result = {"gpu_profile": str(args.gpu), "gpu_costs": {**gpu, "v": {str(n): c for n, c in gpu["v"].items()}},
              "predictions": {}}
    for run in args.acceptance:
        depth = read_json(run / "summary.json", "the bench summary")["config"].get("tree_depth", 4)
        try:
            records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines() if line.strip()]
        except (OSError, ValueError) as e:
            raise SystemExit(f"gpu_predict: cannot read the bench records {run / 'records.jsonl'}: {e}")
        labels = list(dict.fromkeys(r["method"] for r in records))
        result["predictions"][run.name] = predict(records, gpu, depth, labels)
        categories = sorted({r["category"] for r in records})
        for cat in categories if len(categories) > 1 else []:
            result["predictions"][f"{run.name}/{cat}"] = predict([r for r in records if r["category"] == cat], gpu,
                                                                 depth, labels)
    print(table(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
