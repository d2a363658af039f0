"""Numbers from bench records: per method and per category, the theory check, tables and plots.

Speedup is per (prompt, repeat) against plain decoding of the same target in the same run, then
averaged (mean and median). Peers also get a speedup against their own plain decoding (hf-assisted
and hf-lookup against hf, llama-lookup against llama), since llama.cpp runs quantized weights.

Theory (Leviathan et al.): a chain of k drafts with i.i.d. acceptance alpha emits
(1 - alpha^(k+1)) / (1 - alpha) tokens per step and costs k c + v(k+1) plain steps, so the predicted
speedup is their ratio. alpha here is the i.i.d. estimate accepted / (accepted + rejections), the
maximum-likelihood rate of a per-token accept coin; the reported `alpha` (accepted / drafted) is
lower, since drafts after a rejection count as drafted and not accepted. c and v come from the run
itself (draft and verify seconds per step over plain's seconds per step) unless a `specdec profile`
JSON is given.
"""

from __future__ import annotations

import json
import sys
import statistics
from pathlib import Path

from specdec.bench.records import LLAMA_KINDS, Record, chain_theory, drafts, drafts_with_model, is_ours, is_plain
from specdec.policy import interpolate, load_profile

OWN_PLAIN = {"hf-assisted": "hf", "hf-lookup": "hf", "llama-spec": "llama", "llama-lookup": "llama"}
PEER_COLORS = {"hf": "gray", "llama": "brown"}  # the plots' lines of the peers' plain decoding (ours: black)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _by_method(records: list[Record]) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = {}
    for r in records:
        out.setdefault(r.method, []).append(r)
    return out


def _ratios(recs: list[Record], ref: list[Record]) -> list[float]:
    base = {(r.prompt_id, r.repeat): r.tokens_per_second for r in ref}
    return [r.tokens_per_second / base[(r.prompt_id, r.repeat)] for r in recs
            if base.get((r.prompt_id, r.repeat))]


def summarize(records: list[Record], greedy: bool = True) -> dict:
    by_method = _by_method(records)
    plain = next((recs for recs in by_method.values() if is_plain(recs[0].method_kind)), [])
    out = {}
    for method, recs in by_method.items():
        kind = recs[0].method_kind
        s = {"kind": kind, "k": recs[0].k, "adaptive": method.endswith((":auto", ":auto-k")), "prompts": len({r.prompt_id for r in recs}), "runs": len(recs),
             "new_tokens": sum(len(r.tokens) for r in recs), "seconds": round(sum(r.seconds for r in recs), 2)}
        s["tokens_per_second_total"] = round(s["new_tokens"] / s["seconds"], 3) if s["seconds"] else 0.0
        s["tokens_per_second_median"] = round(statistics.median(r.tokens_per_second for r in recs), 3)
        repeats = sorted({r.repeat for r in recs})
        if len(repeats) > 1:
            per = [sum(len(r.tokens) for r in recs if r.repeat == i) / sum(r.seconds for r in recs if r.repeat == i)
                   for i in repeats]
            s["tokens_per_second_repeats"] = {"mean": round(statistics.mean(per), 3),
                                              "stdev": round(statistics.stdev(per), 3), "values": [round(x, 3) for x in per]}
        ratios = _ratios(recs, plain)
        s["speedup_vs_plain_mean"] = round(statistics.mean(ratios), 3) if ratios else None
        s["speedup_vs_plain_median"] = round(statistics.median(ratios), 3) if ratios else None
        if kind in OWN_PLAIN and OWN_PLAIN[kind] in by_method:
            own = _ratios(recs, by_method[OWN_PLAIN[kind]])
            s["speedup_vs_own_plain_mean"] = round(statistics.mean(own), 3) if own else None
        reference = by_method.get("llama", []) if kind in LLAMA_KINDS else plain
        if greedy and recs is not reference and reference:
            s["greedy_mismatches"] = mismatches(recs, reference)
        if is_ours(kind):
            s.update(acceptance_summary([turn for r in recs for turn in r.stats]))
        elif any(r.peer for r in recs):  # llama-server's own count of drafted and accepted tokens
            drafted = sum((r.peer or {}).get("draft_n", 0) for r in recs)
            accepted = sum((r.peer or {}).get("draft_n_accepted", 0) for r in recs)
            s.update(drafted=drafted, accepted=accepted, alpha=round(accepted / drafted, 3) if drafted else 0.0)
        out[method] = s
    return out


def mismatches(recs: list[Record], ref: list[Record]) -> list[dict]:
    base = {(r.prompt_id, r.repeat): r.tokens for r in ref}
    return [{"prompt_id": r.prompt_id, "repeat": r.repeat, "position": first_difference(r.tokens, base[key])}
            for r in recs if (key := (r.prompt_id, r.repeat)) in base and r.tokens != base[key]]


def acceptance_summary(stats: list[dict]) -> dict:
    """Pooled over prompts: alpha = accepted / drafted; tau = emitted / steps; time split in seconds."""
    steps, drafted, accepted = (sum(s[key] for s in stats) for key in ("steps", "drafted", "accepted"))
    rejections = sum(s.get("rejections", 0) for s in stats)
    width = max((len(s["drafted_at"]) for s in stats), default=0)
    at = [(sum(s["accepted_at"][i] for s in stats if i < len(s["accepted_at"])),
           sum(s["drafted_at"][i] for s in stats if i < len(s["drafted_at"]))) for i in range(width)]
    times = {key: round(sum(s[key] for s in stats), 4) for key in ("draft_seconds", "verify_seconds",
                                                                    "prefill_seconds", "seconds")}
    times["other_seconds"] = round(times["seconds"] - times["draft_seconds"] - times["verify_seconds"]
                                   - times["prefill_seconds"], 4)
    verified = sum(s.get("verified_nodes", s["drafted"]) for s in stats)
    width_k = max((len(s.get("k_chosen") or []) for s in stats), default=0)
    k_hist = [sum((s.get("k_chosen") or [])[i] for s in stats if i < len(s.get("k_chosen") or []))
              for i in range(width_k)]
    return {"steps": steps, "drafted": drafted, "accepted": accepted, "rejections": rejections,
            "verified_per_step": round(1 + verified / steps, 3) if steps else 0.0,  # tokens per verify forward
            "k_histogram": k_hist,  # steps per chosen k (index 0 = plain steps)
            "plain_fraction": round(k_hist[0] / steps, 3) if steps and k_hist else 0.0,
            "tau": round((steps + accepted) / steps, 3) if steps else 0.0,
            "alpha": round(accepted / drafted, 3) if drafted else 0.0,
            "alpha_iid": round(accepted / (accepted + rejections), 3) if accepted + rejections else 0.0,
            "per_position_acceptance": [round(a / d, 3) if d else 0.0 for a, d in at],
            "decode_tokens_per_second": round(sum(s["new_tokens"] for s in stats)
                                              / max(times["seconds"] - times["prefill_seconds"], 1e-9), 3),
            "time_split": times}


def predicted_speedup(alpha: float, k: int, c: float, v: float) -> float:
    """(1 - alpha^(k+1)) / ((1 - alpha) (k c + v)), with the alpha -> 1 limit (k + 1) / (k c + v)."""
    tokens = k + 1 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * c + v)


def read_cost_profile(path: str) -> dict:
    data = load_profile(path)
    return {"verify_cost": data["verify_cost"], "draft_cost_ratio": data.get("draft_cost_ratio")}


def plain_of(methods: dict) -> dict | None:
    """The summary of our plain decoding (the method of ours that drafts nothing), or None."""
    return next((s for s in methods.values() if is_plain(s["kind"])), None)


def plain_step_seconds(methods: dict) -> float | None:
    """Seconds of one plain decode step in this run, or None when plain decoding was too short to time."""
    plain = plain_of(methods)
    if not plain or not plain.get("steps") or not plain.get("decode_tokens_per_second"):
        return None
    t1 = plain["time_split"]["verify_seconds"] / plain["steps"]
    return t1 if t1 > 0 else None


def theory(methods: dict, cost_profile: dict | None = None) -> dict:
    """Predicted vs measured speedup for each of our speculative methods."""
    t1 = plain_step_seconds(methods)
    if t1 is None:
        return {}  # too little plain decoding timed to turn seconds into step costs
    plain = plain_of(methods)
    out = {}
    for label, s in methods.items():
        if not chain_theory(s["kind"]) or not s.get("steps") or s.get("adaptive"):
            continue
        k = s["k"]
        if cost_profile:
            v = interpolate(cost_profile["verify_cost"], k + 1)
            c = (cost_profile["draft_cost_ratio"] or 0.0) if drafts_with_model(s["kind"]) else 0.0
            source = "profile"
        else:
            v = s["time_split"]["verify_seconds"] / s["steps"] / t1
            c = s["time_split"]["draft_seconds"] / s["steps"] / k / t1
            source = "run"
        out[label] = {"k": k, "alpha_iid": s["alpha_iid"], "c": round(c, 3), f"v({k + 1})": round(v, 3),
                      "cost_source": source, "tau": s["tau"],
                      "predicted_speedup": round(predicted_speedup(s["alpha_iid"], k, c, v), 3),
                      "measured_decode_speedup": round(s["decode_tokens_per_second"] / plain["decode_tokens_per_second"], 3),
                      "measured_speedup": s["speedup_vs_plain_mean"]}
    return out


def step_costs(methods: dict) -> dict:
    """Per method: tokens per verify forward, and the verify and draft time of one step in plain steps
    (measured in this run: seconds per step over plain decoding's seconds per step)."""
    t1 = plain_step_seconds(methods)
    if t1 is None:
        return {}
    return {label: {"verified_per_step": s["verified_per_step"],
                    "verify_vs_plain_step": round(s["time_split"]["verify_seconds"] / s["steps"] / t1, 3),
                    "draft_vs_plain_step": round(s["time_split"]["draft_seconds"] / s["steps"] / t1, 3),
                    "tau": s["tau"], "plain_fraction": s.get("plain_fraction", 0.0)}
            for label, s in methods.items() if s.get("steps")}


def build_summary(records: list[Record], config: dict, cost_profile: dict | None = None) -> dict:
    failures = [{"prompt_id": r.prompt_id, "method": r.method, "repeat": r.repeat, "error": r.error}
                for r in records if r.error]
    records = [r for r in records if not r.error]
    greedy = config.get("temperature", 0) == 0
    methods = summarize(records, greedy)
    categories = {c: summarize([r for r in records if r.category == c], greedy)
                  for c in sorted({r.category for r in records})}
    return {"config": config, "failures": failures, "methods": methods, "categories": categories,
            "theory": theory(methods, cost_profile), "step_costs": step_costs(methods),
            "theory_by_category": {c: theory(m, cost_profile) for c, m in categories.items()}}


def _fmt(x, spec=".2f", none="-") -> str:
    return none if x is None else format(x, spec)


def method_rows(methods: dict) -> list[str]:
    rows = []
    for label, s in methods.items():
        split = s.get("time_split")
        split_text = "-" if not split else "/".join(
            f"{100 * split[key] / split['seconds']:.0f}" for key in ("draft_seconds", "verify_seconds",
                                                                      "prefill_seconds", "other_seconds"))
        mism = s.get("greedy_mismatches")
        rep = s.get("tokens_per_second_repeats")
        tps = f"{s['tokens_per_second_total']:.2f}" + (f" ± {rep['stdev']:.2f}" if rep else "")
        rows.append(f"| {label} | {s['prompts']} | {tps} | {s['tokens_per_second_median']:.2f} | "
                    f"{_fmt(s['speedup_vs_plain_mean'], '.3f')}x | {_fmt(s['speedup_vs_plain_median'], '.3f')}x | "
                    f"{_fmt(s.get('speedup_vs_own_plain_mean'), '.3f')} | {_fmt(s.get('tau'), '.2f')} | "
                    f"{_fmt(s.get('alpha'), '.2f')} | {split_text} | {'-' if mism is None else len(mism)} |")
    return rows


HEADER = ("| method | prompts | tok/s | tok/s median | speedup mean | speedup median | vs own plain | tau | alpha "
          "| time % draft/verify/prefill/other | greedy mismatches |\n|---|---|---|---|---|---|---|---|---|---|---|")


def markdown(summary: dict) -> str:
    parts = ["## All prompts\n", HEADER, *method_rows(summary["methods"]), ""]
    if summary.get("failures"):
        parts += ["Failed runs (left out above): " + "; ".join(
            f"{f['method']} on {f['prompt_id']}: {f['error']}" for f in summary["failures"]), ""]
    if len(summary["categories"]) > 1:
        for cat, methods in summary["categories"].items():
            parts += [f"## {cat}\n", HEADER, *method_rows(methods), ""]
    return "\n".join(parts) + "\n"


def step_cost_table(summary: dict) -> str:
    rows = ["| method | tokens per verify forward | verify step / plain step | draft per step / plain step "
            "| tau | plain steps |", "|---|---|---|---|---|---|"]
    for label, s in summary.get("step_costs", {}).items():
        rows.append(f"| {label} | {s['verified_per_step']:.2f} | {s['verify_vs_plain_step']:.3f} | "
                    f"{s['draft_vs_plain_step']:.3f} | {s['tau']:.2f} | {100 * s['plain_fraction']:.0f}% |")
    return "\n".join(rows) + "\n"


def theory_table(summary: dict) -> str:
    rows = ["| scope | method | k | alpha (iid) | c | v(k+1) | tau | predicted | measured (decode) | measured (end to end) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    scopes = [("all", summary["theory"])] + list(summary.get("theory_by_category", {}).items())
    for scope, th in scopes:
        for label, t in th.items():
            v = t[f"v({t['k'] + 1})"]
            rows.append(f"| {scope} | {label} | {t['k']} | {t['alpha_iid']:.3f} | {t['c']:.3f} | {v:.3f} | {t['tau']:.2f} | "
                        f"{t['predicted_speedup']:.3f}x | {t['measured_decode_speedup']:.3f}x | "
                        f"{_fmt(t['measured_speedup'], '.3f')}x |")
    return "\n".join(rows) + "\n"


def write_outputs(summary: dict, records: list[Record], out: Path, plots: bool = True) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(markdown(summary) + "\n## Theory check\n\n" + theory_table(summary)
                                    + "\n## Step costs (this run)\n\n" + step_cost_table(summary))
    if plots:
        try:
            make_plots(summary, out)
        except ImportError as e:  # the numbers are already on disk; a missing plotting library must not lose them
            print(f"specdec bench: plots skipped ({e}); pip install matplotlib, then rerun with --report-only",
                  file=sys.stderr)


def make_plots(summary: dict, out: Path) -> list[Path]:
    """speedup per category per method, acceptance by draft position, tokens/s against k."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plots = [(_plot_speedups, "speedup_by_category.png"), (_plot_acceptance, "acceptance_by_position.png"),
             (_plot_tokens_per_second, "tokens_per_second_vs_k.png")]
    paths = []
    for draw, name in plots:
        fig = draw(plt, summary)
        if fig is not None:
            fig.tight_layout()
            paths.append(out / name)
            fig.savefig(paths[-1], dpi=110)
            plt.close(fig)
    return paths


def _plot_speedups(plt, summary: dict):
    cats = list(summary["categories"]) + (["all"] if len(summary["categories"]) > 1 else [])
    scopes = {**summary["categories"], "all": summary["methods"]}
    labels = [m for m, s in summary["methods"].items() if not is_plain(s["kind"])]
    if not labels:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cats) * max(1, len(labels)) / 3), 4))
    width = 0.8 / len(labels)
    for j, label in enumerate(labels):
        ys = [(scopes[c].get(label) or {}).get("speedup_vs_plain_mean") or 0 for c in cats]
        ax.bar([i + j * width for i in range(len(cats))], ys, width, label=label)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cats))], cats, rotation=20)
    ax.set_ylabel("speedup vs our plain decoding")
    ax.legend(fontsize=7, ncol=2)
    return fig


def _plot_acceptance(plt, summary: dict):
    spec = {m: s for m, s in summary["methods"].items() if s.get("per_position_acceptance")}
    if not spec:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, s in spec.items():
        acc = s["per_position_acceptance"]
        ax.plot(range(1, len(acc) + 1), acc, marker="o", label=label)
    ax.set_xlabel("draft position")
    ax.set_ylabel("fraction accepted")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    return fig


def _plot_tokens_per_second(plt, summary: dict):
    kinds: dict[str, list[tuple[int, float]]] = {}
    adaptive = {m: s for m, s in summary["methods"].items() if s.get("adaptive")}
    for s in summary["methods"].values():
        if drafts(s["kind"]) and not s.get("adaptive"):
            kinds.setdefault(s["kind"], []).append((s["k"], s["tokens_per_second_total"]))
    if not (kinds or adaptive):
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, pts in kinds.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=kind)
    for label, s in adaptive.items():
        ax.axhline(s["tokens_per_second_total"], ls=":", lw=1.2, label=f"{label} (adaptive k)")
    for base, s in summary["methods"].items():
        if not drafts(s["kind"]):
            ax.axhline(s["tokens_per_second_total"], ls="--", lw=0.8, label=f"{base} (no drafting)",
                       color=PEER_COLORS.get(s["kind"], "black"))
    ax.set_xlabel("k (draft tokens per step)")
    ax.set_ylabel("tokens/s")
    ax.legend(fontsize=7)
    return fig
