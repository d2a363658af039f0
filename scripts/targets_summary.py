"""The page summary docs/results/targets.json from scripts/targets_bench.sh's runs: for each
instruction-set target, ours against llama.cpp built for the same target on one host. Copies each
target's raw runs (profile, bench summaries, prefill) to docs/results/raw/targets/TARGET/ and writes
one table: per target, plain decoding, the defaults and prefill, ours and llama.cpp's, with what a
verified row and a draft token cost in the notes.

Usage: python scripts/targets_summary.py --cpu "2 cores of an Intel Xeon ..." [--runs runs/targets] \
    [--note TEXT ...] [TARGET ...]
"""

import argparse
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
BUILDS = {"x86-64-v3": "AVX2 and FMA, most laptops", "x86-64-v3+avxvnni": "with AVX-VNNI, Alder Lake and later",
          "native": "-march=native, here AVX-512 with VNNI"}


def method_row(summary: dict, method: str, label: str, llama: dict | None) -> dict:
    m = summary["methods"][method]
    return {"measure": label, "ours": m["tokens_per_second_total"], "llama": llama and llama["tokens_per_second_total"],
            "ours_over_llama": llama and m["tokens_per_second_total"] / llama["tokens_per_second_total"],
            "x_plain": m["speedup_vs_plain_mean"], "tau": m["tau"] if m["kind"] != "plain" else None}


def rows_of(run: Path) -> tuple[list[dict], list[str]]:
    rows, sources = [], []
    for name, what in (("code", "10 code prompts"), ("specbench", "Spec-Bench, 18 prompts")):
        path = run / name / "summary.json"
        if not path.exists():
            continue
        s = json.loads(path.read_text())
        llama = s["methods"].get("llama")
        rows.append(method_row(s, "plain", f"plain decoding, {what} (tok/s)", llama))
        rows.append(method_row(s, "draft:auto", f"the defaults, {what} (tok/s)", None))
        sources.append(path)
    if (run / "prefill.json").exists():
        p = json.loads((run / "prefill.json").read_text())
        for n, r in p["lengths"].items():
            rows.append({"measure": f"prefill, {n} tokens (tok/s)", "ours": r["ours_tok_s"], "llama": r["llama_tok_s"],
                         "ours_over_llama": r["ours_over_llama"]})
        sources.append(run / "prefill.json")
    return rows, sources


def notes_of(run: Path, rows: list[dict]) -> list[str]:
    notes = []
    if (run / "profile.json").exists():
        p = json.loads((run / "profile.json").read_text())
        v = p["verify_cost"]
        notes.append(f"`specdec profile`: v(5) {v['5']:.2f}, v(9) {v['9']:.2f}, v(17) {v['17']:.2f} plain steps; the "
                     f"draft's step {p['draft_cost_ratio']:.3f} of the target's, its prefill "
                     f"{p['draft_prefill_cost']:.3f} plain steps per prompt token; plain decoding at "
                     f"{p['roofline_fraction']:.0%} of the memory roofline ({p['bandwidth_gbs']:.1f} GB/s).")
    return notes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="runs/targets")
    ap.add_argument("--cpu", required=True, help="the host, as the page names it")
    ap.add_argument("--note", action="append", default=[], help="a note under the table")
    ap.add_argument("targets", nargs="*", default=list(BUILDS))
    args = ap.parse_args()
    rows, notes, kept = [], [], []
    for target in args.targets:
        run = Path(args.runs) / target
        target_rows, sources = rows_of(run)
        if not target_rows:
            raise SystemExit(f"no runs for {target} under {run}")
        rows += [{"build": target, **r} for r in target_rows]
        notes += [f"{target}: {n}" for n in notes_of(run, target_rows)]
        raw = RESULTS / "raw" / "targets" / target
        raw.mkdir(parents=True, exist_ok=True)
        for src in sources + [run / "profile.json"]:
            if src.exists():
                dest = raw / (f"{src.parent.name}-summary.json" if src.name == "summary.json" else src.name)
                shutil.copyfile(src, dest)
                kept.append(str(dest.relative_to(ROOT)))
    summary = {
        "section": "targets",
        "title": "Each target: ours against llama.cpp built for the same target",
        "cpu": args.cpu,
        "setup": f"Host: {args.cpu}. Ours built with `SPECDEC_CPU_TARGET=TARGET`, llama.cpp with "
                 "`scripts/llama_cpp.sh build TARGET`: " + "; ".join(f"{t}: {BUILDS.get(t, t)}" for t in args.targets)
                 + ". Bench rows interleave ours and llama.cpp's prompt by prompt (greedy, 128 new tokens, prefill "
                 "included); prefill rows alternate ours and llama-server's prompt processing of the same token ids.",
        "command": "scripts/llama_cpp.sh build TARGET && scripts/targets_bench.sh " + " ".join(args.targets),
        "source": kept,
        "columns": [["build", "build"], ["measure", "measure"], ["ours", "ours", "f2"], ["llama", "llama.cpp", "f2"],
                    ["ours_over_llama", "ours / llama.cpp", "x"], ["x_plain", "x our plain", "x"], ["tau", "tau", "f2"]],
        "rows": rows,
        "notes": notes + args.note,
    }
    out = RESULTS / "targets.json"
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main()
