"""Editor code completion through /infill, as llama.vscode asks for it, on `specdec serve` and on
llama-server: the same fill-in-the-middle gaps (input_prefix, input_suffix, n_predict; greedy, or with
--vscode-sampling llama.vscode's own sampling: samplers top_k, top_p and infill). Ours
answers every gap twice, drafting and plain (`"speculative.n_max": 0` on the same server), a pass over
the gaps each, in an order that alternates by round (by the next pass a gap's prompt has left the
one-slot prefix cache, so no request finds its prompt cached); llama-server takes no per-request
draft limit, so it runs twice, without a draft and with `-md` and its draft-model speculation
(`--spec-type draft-simple`, its own draft lengths). The servers take
turns (ours, llama's plain, llama's with the draft; then the reverse), one at a time alone on the CPU.

With --typing N each gap is asked N times, its middle typed a few characters further each time, as an
editor asks while someone types: the later requests extend the earlier ones' prompts (the prefix caches'
case). --servers picks the servers; --checkout serves ours from another checkout (a git worktree), for an
A/B of two versions run one after the other.

Per server and mode: median latency of a request, generation rate (its `timings`' predicted tokens over
predicted ms, summed over gaps), median prompt ms, and how many answers equal the same server's plain
ones (greedy: all should, for ours; sampled, drafting draws other samples from the same seed). Writes the records and the summary as one JSON.

Usage: SPECDEC_HOME=... python scripts/infill_bench.py --model qwen2.5-coder-1.5b-instruct \
    --draft qwen2.5-coder-0.5b-instruct --dataset docs/results/prompts/fim20.jsonl --out infill.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.bench.llama_server import LlamaServer, LlamaServerPeer, find_binary  # noqa: E402
from specdec.bench.loadtest import free_port, start_server, stop_server  # noqa: E402
from specdec.model.registry import pull  # noqa: E402


def typed(gaps: list[dict], times: int, chars: int) -> list[dict]:
    """Each gap asked `times` times as someone types its middle: request j's prefix has the middle's first
    j x chars characters after it (the prompt of request j extends request j - 1's)."""
    return [gap | {"id": f"{gap['id']}+{j * chars}", "prompt": gap["prompt"] + gap.get("middle", "")[:j * chars]}
            for gap in gaps for j in range(times)]


# llama.vscode's sampling: its samplers (no temperature: the logits as they are) and cuts, a seed per gap here
VSCODE = {"samplers": ["top_k", "top_p", "infill"], "top_k": 40, "top_p": 0.99}


def ask(base: str, gap: dict, n_predict: int, mode: str, vscode: bool = False) -> dict:
    body = {"input_prefix": gap["prompt"], "input_suffix": gap["suffix"], "input_extra": [], "prompt": "",
            "n_predict": n_predict, "temperature": 0, "cache_prompt": True, "stream": False}
    if vscode:
        body |= VSCODE | {"seed": sum(map(ord, gap["id"]))}
    if mode == "plain":
        body["speculative.n_max"] = 0
    t0 = time.perf_counter()
    r = httpx.post(base + "/infill", json=body, timeout=600)
    seconds = time.perf_counter() - t0
    r.raise_for_status()
    out = r.json()
    t = out["timings"]
    return {"id": gap["id"], "mode": mode, "seconds": seconds, "content": out["content"],
            "prompt_n": t["prompt_n"], "prompt_ms": t["prompt_ms"], "predicted_n": t["predicted_n"],
            "predicted_ms": t["predicted_ms"], "draft_n": t.get("draft_n", 0),
            "draft_n_accepted": t.get("draft_n_accepted", 0)}


def run_gaps(base: str, gaps: list[dict], n_predict: int, modes: tuple[str, ...], vscode: bool = False) -> list[dict]:
    """Every gap in each mode, a pass per mode: by the next pass a gap's prompt has left the prefix cache
    (one slot, the other gaps since), so no request finds its prompt cached (with --typing, a gap's later
    requests find its earlier ones' text, as an editor's do)."""
    return [ask(base, gap, n_predict, mode, vscode) for mode in modes for gap in gaps]


def summarize(records: list[dict]) -> dict:
    out = {}
    for server in sorted({r["server"] for r in records}):
        plain = {r["id"]: r["content"] for r in records if r["server"] == server and r["mode"] == "plain"}
        for mode in ("plain", "spec"):
            rs = [r for r in records if r["server"] == server and r["mode"] == mode]
            if not rs:
                continue
            ms = sum(r["predicted_ms"] for r in rs)
            out[f"{server} {mode}"] = {
                "requests": len(rs), "median_seconds": round(statistics.median(r["seconds"] for r in rs), 3),
                "mean_seconds": round(statistics.mean(r["seconds"] for r in rs), 3),
                "tokens_per_second": round(1000.0 * sum(r["predicted_n"] for r in rs) / ms, 2) if ms else None,
                "median_prompt_ms": round(statistics.median(r["prompt_ms"] for r in rs), 1),
                "tokens": sum(r["predicted_n"] for r in rs),
                "alpha": round(sum(r["draft_n_accepted"] for r in rs) / max(1, sum(r["draft_n"] for r in rs)), 3),
                "same_as_plain": f"{sum(r['content'] == plain.get(r['id']) for r in rs)}/{len(rs)}"}
    base = out.get("specdec plain", {}).get("tokens_per_second")
    for row in out.values():
        row["rate_vs_specdec_plain"] = round(row["tokens_per_second"] / base, 3) if base and row["tokens_per_second"] else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--dataset", default="docs/results/prompts/fim20.jsonl")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--n-predict", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-bin", default=None)
    p.add_argument("--servers", default="specdec,llama,llama-spec", help="which of specdec, llama, llama-spec")
    p.add_argument("--checkout", default=None, help="serve ours from this checkout (a git worktree) instead")
    p.add_argument("--typing", type=int, default=1, metavar="N",
                   help="ask each gap N times, its middle typed --typing-chars further each time")
    p.add_argument("--typing-chars", type=int, default=8)
    p.add_argument("--vscode-sampling", action="store_true",
                   help="sample as llama.vscode asks (samplers top_k, top_p, infill; top-k 40, top-p 0.99), a seed "
                        "per gap, instead of greedy")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    gaps = typed([json.loads(line) for line in Path(a.dataset).read_text().splitlines() if line.strip()][:a.limit],
                 a.typing, a.typing_chars)
    model, draft = pull(a.model), pull(a.draft)
    logs = Path(a.out).with_suffix(".logs")
    logs.mkdir(parents=True, exist_ok=True)
    records = []
    servers = tuple(s for s in ("specdec", "llama", "llama-spec") if s in a.servers.split(","))
    for round_no in range(a.rounds):
        for server in (servers if round_no % 2 == 0 else servers[::-1]):
            print(f"round {round_no + 1}: {server}", flush=True)
            if server == "specdec":
                port = free_port()
                proc = start_server(str(model), ["--draft", str(draft), "--max-context", str(a.context)], port, 1,
                                    logs / f"specdec-{round_no}.log", cwd=a.checkout)
                try:
                    rows = run_gaps(f"http://127.0.0.1:{port}", gaps, a.n_predict,
                                    ("spec", "plain") if round_no % 2 == 0 else ("plain", "spec"), a.vscode_sampling)
                finally:
                    stop_server(proc)
            else:
                spec = server == "llama-spec"
                llama = LlamaServer(find_binary(a.llama_bin), model, draft if spec else None, a.context, a.threads,
                                    logs / f"{server}-{round_no}.log", LlamaServerPeer.server_flags("spec") if spec else [])
                try:
                    mode = "spec" if server == "llama-spec" else "plain"
                    rows = run_gaps(llama.url, gaps, a.n_predict, (mode,), a.vscode_sampling)
                finally:
                    llama.close()
            records += [r | {"server": server.removesuffix("-spec"), "round": round_no} for r in rows]
    summary = summarize(records)
    Path(a.out).write_text(json.dumps({"command": " ".join(sys.argv), "summary": summary, "records": records},
                                      indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
