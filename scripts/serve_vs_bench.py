"""Does `specdec serve` at one client give what `specdec bench` gives on the same prompts? Each side's
speedup over its own plain decoding: bench's drafting method against its plain (tok/s over all prompts,
prefill included), and loadtest's 'policy' mode against 'off' at concurrency 1 (a fresh server each,
streamed chat completions). With --in-process, this checkout's server without HTTP too: its scheduler
thread against the same engine stepped directly. Run in this checkout and, with --old, in another (a `git worktree`), in the
order new, old, old, new (--rounds 2) so slow drift hits both alike; separate processes throughout.

Usage: python scripts/serve_vs_bench.py --model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct \
    --k 8 --max-tokens 96 [--old /tmp/before] --out runs/serve-vs-bench.json
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def run(checkout: Path, args: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "specdec.cli", *args], cwd=checkout, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def bench(checkout: Path, a, out: Path) -> dict:
    """bench's tok/s per method (plain, and the drafter under the adaptive policy at k <= --k)."""
    data = ["--dataset", a.dataset] if a.dataset else []
    run(checkout, ["bench", "--model", a.model, "--draft", a.draft, "--methods", "plain,draft", "--k", "auto",
                   *data, "--limit", str(a.limit), "--max-new-tokens", str(a.max_tokens), "--no-plots", "--out",
                   str(out)])
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    speed = {}
    for m in sorted({r["method"] for r in rows}):
        mine = [r for r in rows if r["method"] == m]
        speed[m] = sum(len(r["tokens"]) for r in mine) / sum(r["seconds"] for r in mine)
    plain = next(v for m, v in speed.items() if m.startswith("plain"))
    spec = next(v for m, v in speed.items() if not m.startswith("plain"))
    return {"tok_s": speed, "speedup": spec / plain}


def loadtest(checkout: Path, a, out: Path) -> dict:
    """loadtest's tok/s at one client, 'off' and 'policy' (the drafter under the adaptive policy, k <= --k)."""
    data = ["--dataset", a.dataset] if a.dataset else []
    run(checkout, ["loadtest", "--model", a.model, "--draft", a.draft, "--modes", "off,policy", "--concurrency", "1",
                   "--min-requests", str(a.limit), "--max-tokens", str(a.max_tokens), "--k", str(a.k), *data,
                   "--out", str(out)])
    modes = json.loads((out / "summary.json").read_text())["modes"]
    speed = {m: modes[m]["1"]["throughput_tokens_per_second"] for m in ("off", "policy")}
    return {"tok_s": speed, "speedup": speed["policy"] / speed["off"],
            "tau": modes["policy"]["1"]["tau"], "drafting_share": modes["policy"]["1"]["speculation_on_fraction"]}


def in_process(a) -> dict:
    """This checkout's server without HTTP: the scheduler's thread (admission, text, events) against
    the same engine stepped directly (`Engine.generate`), prompt by prompt, alternating."""
    sys.path.insert(0, str(HERE))
    import threading
    import time

    from specdec.bench.datasets import load_prompts
    from specdec.config import GenerationConfig
    from specdec.model.tokenizer import encode_messages
    from specdec.server import build_scheduler
    from specdec.server.scheduler import RequestParams
    from specdec.settings import DraftingSettings, ModelSettings, ServeSettings
    sched = build_scheduler(ModelSettings(model=a.model), DraftingSettings(draft=a.draft, k=a.k),
                            ServeSettings(prefix_cache=False),
                            progress=lambda m: None)
    sched.start()
    prompts = [encode_messages(sched.tokenizer, [{"role": "user", "content": p.turns[0]}])
               for p in load_prompts(a.dataset)][:a.limit]

    def served(ids):
        done = threading.Event()
        sched.submit(ids, RequestParams(a.max_tokens), lambda ev: done.set() if ev.kind == "done" else None)
        done.wait()

    def direct(ids):  # the scheduler's thread is idle meanwhile
        sched.engine.generate(ids, GenerationConfig(a.max_tokens, a.k), sched.eos_ids)

    seconds = {"scheduler": 0.0, "engine": 0.0}
    for i, ids in enumerate(prompts):
        for name, fn in ((("scheduler", served), ("engine", direct)) if i % 2 == 0 else
                         (("engine", direct), ("scheduler", served))):
            t0 = time.perf_counter()
            fn(ids)
            seconds[name] += time.perf_counter() - t0
    sched.stop()
    return {"seconds": seconds, "scheduler_over_engine": seconds["engine"] / seconds["scheduler"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--dataset", default=None, help="JSONL prompts (default: the shipped code prompts)")
    ap.add_argument("--limit", type=int, default=10, help="prompts (bench) and requests (loadtest)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=8, help="the server policy's largest k (bench's --k auto: 8)")
    ap.add_argument("--old", default=None, help="another checkout to run the same in")
    ap.add_argument("--rounds", type=int, default=1, help="2: new, old, old, new")
    ap.add_argument("--in-process", action="store_true",
                    help="also time this checkout's scheduler without HTTP against its engine stepped directly")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    order = ["new", "old"] if a.old else ["new"]
    order = (order + order[::-1]) if a.rounds > 1 else order
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, side in enumerate(order):
            checkout = HERE if side == "new" else Path(a.old)
            b = bench(checkout, a, Path(tmp) / f"bench{i}")
            s = loadtest(checkout, a, Path(tmp) / f"load{i}")
            runs.append({"side": side, "bench": b, "serve": s, "serve_over_bench": s["speedup"] / b["speedup"]})
            print(json.dumps(runs[-1]), file=sys.stderr)
    summary = {side: {"bench_speedup": statistics.mean(r["bench"]["speedup"] for r in runs if r["side"] == side),
                      "serve_speedup": statistics.mean(r["serve"]["speedup"] for r in runs if r["side"] == side),
                      "serve_over_bench": statistics.mean(r["serve_over_bench"] for r in runs if r["side"] == side)}
               for side in dict.fromkeys(order)}
    sys.path.insert(0, str(HERE))
    from specdec.bench.host import cpu_name
    result = {"command": " ".join(sys.argv), "cpu": cpu_name(), "summary": summary, "runs": runs}
    if a.in_process:
        result["in_process"] = in_process(a)
        print(json.dumps(result["in_process"]), file=sys.stderr)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
