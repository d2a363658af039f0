"""Build docs/performance.md from the page summaries in docs/results/*.json.

A page summary is one small JSON file: the table's section, its title, the command that produced the
numbers, the raw run it was read from, and the rows. Later work adds one summary and regenerates:

    python scripts/make_results.py                    # write docs/performance.md (make results)
    python scripts/make_results.py --check            # exit 1 if docs/performance.md is out of date
    python scripts/make_results.py extract FILE.json  # refill FILE's rows from its raw source run

A summary's keys (only "rows" and "command" are required):
    section   which part of the page it belongs to (SECTIONS below; default: the file's stem)
    order     its place within the section (default 0; then by file name)
    title     the table's heading
    command   the command that produced the numbers
    cpu       the host's CPU model as lscpu names it, and its cores
    setup     one paragraph: models, prompts, mode, what is compared
    source    the raw run(s) the rows come from (bench or loadtest summary.json files under docs/results/raw/)
    extract   how `extract` reads the rows from source (kinds: methods, matrix, policy, loadtest), or a
              list of such specs, each naming its own "source"; a methods spec with "drafting": true
              adds each method's acceptance by draft position and its c
    columns   [[key, header, format], ...]; format one of x (1.234x), f1, f2, f3, pct, or none;
              default: every key of the rows, as it is
    rows      [{key: value}, ...]
    notes     ["...", ...] printed under the table
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "performance.md"

HOST = ("2 cores of an AMD EPYC, CPU family 26 (Zen 5: AVX-512 with VNNI and BF16), 24 GiB, no GPU, under KVM; "
        "llama.cpp built here from the llama-cpp-python 0.3.36 sdist (commit 0c1e570, Release, GGML_NATIVE) "
        "by `scripts/llama_cpp.sh build`")

SECTIONS = [
    ("recommended", "What to run", ""),
    ("peers", "Against llama.cpp on the same files",
     "llama.cpp's own `llama-server` on the same GGUF files, the same token ids and thread count, interleaved "
     "prompt by prompt with ours. Speedups are the mean of per-prompt ratios against our plain decoding in the "
     "same run; times include the prefill."),
    ("drafters", "Which drafter wins on which kind of text",
     "Greedy: every drafter's output equals plain decoding's (the greedy mismatches column)."),
    ("costs", "What a verified row and a draft token cost", ""),
    ("targets", "Instruction sets: ours and llama.cpp built for the same target",
     "The kernels build for the compiler's target: `native` by default, or the one `SPECDEC_CPU_TARGET` names "
     "(`docs/design.md`). The table below holds both engines built for each target, all on one host that is not "
     "the reference host; every build gives the same bits (`tests/test_quant_q8.py`, `tests/test_arm.py`)."),
    ("drafts", "Draft models: 4 or 8 bits, the target's own copy, another tokenizer", ""),
    ("families", "Other model families", ""),
    ("memory-startup", "Memory and start-up", ""),
    ("serving", "Serving under time and faults", ""),
]

FORMATS = {"x": "{:.3f}x", "f1": "{:.1f}", "f2": "{:.2f}", "f3": "{:.3f}", "pct": "{:.0%}"}


def load_summaries(results: Path = RESULTS) -> list[tuple[str, dict]]:
    """(file name, summary) for every page summary, in page order."""
    known = [s[0] for s in SECTIONS]
    found = []
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        data.setdefault("section", path.stem)
        found.append((path.name, data))
    rank = lambda item: (known.index(item[1]["section"]) if item[1]["section"] in known else len(known),
                         item[1].get("order", 0), item[0])
    return sorted(found, key=rank)


def cell(value, fmt: str | None) -> str:
    if value is None:
        return "-"
    if fmt in FORMATS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return FORMATS[fmt].format(value)
    return str(value)


def columns_of(summary: dict) -> list[list]:
    if "columns" in summary:
        return [c + [None] * (3 - len(c)) for c in summary["columns"]]
    keys = []
    for row in summary["rows"]:
        keys += [k for k in row if k not in keys]
    return [[k, k, None] for k in keys]


def table(summary: dict) -> list[str]:
    cols = columns_of(summary)
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for row in summary["rows"]:
        lines.append("| " + " | ".join(cell(row.get(c[0]), c[2]) for c in cols) + " |")
    return lines


def block(name: str, summary: dict) -> list[str]:
    out = [f"### {summary.get('title', Path(name).stem)}", ""]
    if summary.get("setup"):
        out += [summary["setup"], ""]
    out += table(summary) + [""]
    out += [f"- {note}" for note in summary.get("notes", [])]
    sources = summary.get("source") or []
    sources = [sources] if isinstance(sources, str) else sources
    source = ", raw run " + ", ".join(f"`{s}`" for s in sources) if sources else ""
    out.append(f"- Summary: `docs/results/{name}`{source}.")
    if is_shell(summary["command"]):
        out += ["- Command:", "", "  ```bash", f"  {summary['command']}", "  ```", ""]
    else:
        out += [f"- Command: {summary['command']}.", ""]
    return out


def is_shell(command: str) -> bool:
    """A command line, or a sentence saying how the numbers were taken."""
    first = command.split()[0]
    return first in ("specdec", "python", "make", "env") or first.startswith("scripts/") or "=" in first


def render(summaries: list[tuple[str, dict]]) -> str:
    out = ["# Performance: the current numbers", "",
           "Generated by `make results` (`scripts/make_results.py`) from the summaries in `docs/results/*.json`; "
           "do not edit by hand. Every table is one run on one host, named in its summary with the command that "
           "produced it, with nothing else running unless the table says so. Unless a table says otherwise: target "
           "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF), draft Qwen2.5-Coder-0.5B-Instruct (its blocks re-encoded "
           "at load as 4-bit, `--draft-bits 4`, where the default `--draft-bits auto` puts the MLP's gate and up at "
           "3 bits on this host), the defaults (`--policy adaptive`, `--draft-vocab 32768`), greedy decoding, 128 "
           "new tokens, prefill included.", "",
           f"Reference host: {HOST}. Its speed drifts by tens of percent from minute to minute: compare numbers "
           "within one table (every method interleaved prompt by prompt), not across tables. Runs on other hosts "
           "stay as raw files under `docs/results/raw/`.", ""]
    titles = {s[0]: (s[1], s[2]) for s in SECTIONS}
    current = None
    for name, summary in summaries:
        section = summary["section"]
        if section != current:
            current = section
            heading, blurb = titles.get(section, (section, ""))
            out += [f"## {heading}", ""] + ([blurb, ""] if blurb else [])
        out += block(name, summary)
    return "\n".join(out).rstrip() + "\n"


# ---- extract: rows from a raw run ----

def method_row(scope: str, label: str, name: str, m: dict) -> dict:
    mismatches = m.get("greedy_mismatches")
    return {"scope": scope, "method": name, "tokens_per_second": m.get("tokens_per_second_total"),
            "x_plain": m.get("speedup_vs_plain_mean"), "x_plain_median": m.get("speedup_vs_plain_median"),
            "x_own_plain": m.get("speedup_vs_own_plain_mean"), "tau": m.get("tau") if m.get("kind") not in
            ("hf", "hf-assisted", "hf-lookup", "llama", "llama-lookup") else None,
            "alpha": m.get("alpha") or None, "plain_steps": m.get("plain_fraction"),
            "mismatches": len(mismatches) if isinstance(mismatches, list) else None}


def drafting_row(m: dict, costs: dict | None) -> dict:
    """A methods spec's "drafting": true adds the acceptance at each draft position and c."""
    return {"per_position": " ".join(f"{a:.2f}" for a in m.get("per_position_acceptance") or []) or None,
            "c": draft_cost(m, costs)}


def draft_cost(m: dict, costs: dict | None) -> float | None:
    """c: a draft token's time over a plain step, from the run's step costs (draft time per step over a
    plain step) and the tokens drafted per step; fixed k only (an adaptive run's steps are mostly plain)."""
    if not costs or m.get("adaptive") or not m.get("steps") or not m.get("drafted"):
        return None
    return round(costs["draft_vs_plain_step"] / (m["drafted"] / m["steps"]), 3)


def extract_methods(raw: dict, spec: dict) -> list[dict]:
    """One row per (scope, method): scope 'all' is the whole run, else a category."""
    labels = spec.get("labels", {})
    rows = []
    for scope in spec.get("scopes", ["all"]):
        methods = raw["methods"] if scope == "all" else raw["categories"][scope]
        rows += [{**method_row(scope, label, labels.get(label, label), methods[label]),
                  **(drafting_row(methods[label], raw.get("step_costs", {}).get(label) if scope == "all" else None)
                     if spec.get("drafting") else {})}
                 for label in spec["methods"] if label in methods]
    return rows


def extract_policy(raw: dict, spec: dict) -> list[dict]:
    """Per scope: the adaptive method against plain and against the best fixed k of its kind."""
    adaptive, kind = spec.get("adaptive", "draft:auto"), spec.get("fixed_kind", "draft")
    rows = []
    for scope, methods in [("all", raw["methods"])] + sorted(raw["categories"].items()):
        a = methods[adaptive]
        fixed = {lab: m for lab, m in methods.items() if m.get("kind") == kind and not m.get("adaptive")}
        best_label, best = max(fixed.items(), key=lambda kv: kv[1]["speedup_vs_plain_mean"])
        rows.append({"scope": scope, "auto_x_plain": a["speedup_vs_plain_mean"],
                     "best_k": int(best_label.split(":")[-1]), "best_x_plain": best["speedup_vs_plain_mean"],
                     "auto_over_best": round(a["speedup_vs_plain_mean"] / best["speedup_vs_plain_mean"], 3),
                     "plain_steps": a.get("plain_fraction")})
    return rows


def extract_loadtest(raw: dict, spec: dict) -> list[dict]:
    """Per concurrency level: throughput of each mode, the others relative to off, and the policy's share."""
    modes = raw["modes"]
    rows = []
    for c in sorted(modes["off"], key=int):
        off = modes["off"][c]
        row = {"concurrency": int(c), "off_tps": off["throughput_tokens_per_second"]}
        for mode in ("on", "policy"):
            if mode in modes and c in modes[mode]:
                level = modes[mode][c]
                row[f"{mode}_tps"] = level["throughput_tokens_per_second"]
                row[f"{mode}_x_off"] = round(level["throughput_tokens_per_second"] / off["throughput_tokens_per_second"], 3)
                row[f"{mode}_p50_s"] = level["latency_p50"]
        row["policy_drafting"] = modes.get("policy", {}).get(c, {}).get("speculation_on_fraction")
        row["off_p50_s"] = off["latency_p50"]
        row["failed"] = sum(modes[m][c]["failed"] for m in modes if c in modes[m])
        rows.append(row)
    return rows


def extract_matrix(raw: dict, spec: dict) -> list[dict]:
    """One row per scope, one column per method: its speedup over plain (mean of per-prompt ratios)."""
    labels = spec.get("labels", {})
    rows = []
    for scope in spec.get("scopes", ["all"] + sorted(raw["categories"])):
        methods = raw["methods"] if scope == "all" else raw["categories"][scope]
        row = {"scope": scope, "prompts": methods[spec["methods"][0]].get("prompts")}
        row.update({labels.get(m, m): methods[m]["speedup_vs_plain_mean"] for m in spec["methods"] if m in methods})
        rows.append(row)
    return rows


def extracted_rows(summary: dict, root: Path = ROOT) -> list[dict]:
    """The rows that summary's extract spec (or list of specs, each with its own source) reads."""
    specs = summary["extract"] if isinstance(summary["extract"], list) else [summary["extract"]]
    rows = []
    for spec in specs:
        raw = json.loads((root / spec.get("source", summary["source"])).read_text())
        rows += EXTRACTORS[spec["kind"]](raw, spec)
    return rows


EXTRACTORS = {"methods": extract_methods, "matrix": extract_matrix, "policy": extract_policy,
              "loadtest": extract_loadtest}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", nargs="?", default="page", choices=("page", "extract"))
    ap.add_argument("files", nargs="*", help="extract: the page summaries to refill")
    ap.add_argument("--check", action="store_true", help="page: fail if docs/performance.md is out of date")
    args = ap.parse_args(argv)
    if args.action == "extract":
        for name in args.files:
            path = Path(name)
            summary = json.loads(path.read_text())
            summary["rows"] = extracted_rows(summary)
            path.write_text(json.dumps(summary, indent=1) + "\n")
            print(f"{path}: {len(summary['rows'])} rows from {summary['source']}")
        return 0
    text = render(load_summaries())
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print("docs/performance.md is out of date: run `make results`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
