"""Start-up and memory, side by side: each setup runs as a fresh process that loads its model(s) and
answers one chat prompt; we record the time from process start to the first answer token on stdout,
the total time, the child's peak RSS, and the disk that SPECDEC_HOME holds beyond the GGUF files and
the kernel build. Setups run interleaved, round by round. Prints JSON.

Setups: `ours` (specdec generate, this checkout), `ours@DIR` (the same command run in another checkout,
e.g. a `git worktree` of an older commit: `python -m` there imports that checkout's package), `llama` (llama.cpp's
llama-completion on the same GGUF file, the raw prompt). A `+draft` suffix adds the draft model (ours only).

Usage: python scripts/startup_bench.py --setups ours,ours+draft,llama [--rounds 3] [--max-new-tokens 32] \
    [--prompt-file FILE] > runs/startup.json

--prompt-file: the prompt's text from a file (a long prompt: the first token then waits for its prefill).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "Write a Python function that merges two sorted lists into one sorted list."


def command(setup: str, args) -> tuple[list[str], dict, str]:
    from specdec.model.registry import pull
    base, draft = setup.split("+")[0], setup.endswith("+draft")
    env, cwd = dict(os.environ), str(Path(__file__).resolve().parents[1])
    if base == "llama":  # llama.cpp's llama-completion, greedy, the raw prompt (its own chat mode off)
        from specdec import peer_environ
        from specdec.bench.llama_server import find_binary
        env = peer_environ()
        binary = find_binary(args.llama_bin).parent / "llama-completion"
        return [str(binary), "-m", str(pull(args.model)), "-c", str(args.max_context), "-t", "2", "-tb", "2",
                "-n", str(args.max_new_tokens), "--temp", "0", "-no-cnv", "--no-display-prompt", "-p", args.prompt], env, cwd
    cmd = [sys.executable, "-m", "specdec.cli", "generate", "--model", args.model, "--chat",
           "--max-new-tokens", str(args.max_new_tokens), "--max-context", str(args.max_context),
           "--draft", args.draft if draft else "none", args.prompt]
    if base.startswith("ours@"):  # `python -m` puts the working directory first on sys.path
        cwd = base.split("@", 1)[1]
    return cmd, env, cwd


def run_once(cmd: list[str], env: dict, cwd: str) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    first = proc.stdout.read(1)
    t_first = time.perf_counter() - t0
    rest = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0 or not first:
        raise SystemExit(f"{' '.join(cmd[:6])}... failed (status {status})")
    return {"first_token_s": round(t_first, 3), "total_s": round(time.perf_counter() - t0, 3),
            "peak_rss_gb": round(usage.ru_maxrss / 1e6, 3), "chars": len(first + rest)}


def home_extra_gb() -> float:
    """GB under SPECDEC_HOME other than models/ (the GGUF files), kernels/ (the build) and llama.cpp/ (the peer's
    source and binaries)."""
    from specdec.model.registry import specdec_home
    home = specdec_home()
    total = 0
    for p in home.rglob("*"):
        rel = p.relative_to(home).parts
        if p.is_file() and rel[0] not in ("models", "kernels", "llama.cpp"):
            total += p.stat().st_size
    return round(total / 1e9, 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--setups", default="ours,ours+draft,llama")
    ap.add_argument("--llama-bin", default=None, help="llama.cpp's build (as specdec bench --llama-bin)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--max-context", type=int, default=2048)
    ap.add_argument("--prompt-file", default=None, help="the prompt's text (default: a one-line coding question)")
    args = ap.parse_args()
    try:
        args.prompt = Path(args.prompt_file).read_text() if args.prompt_file else PROMPT
    except OSError as e:
        ap.error(f"--prompt-file: {e}")
    if not args.prompt.strip():
        ap.error("--prompt-file: the file holds no prompt")
    setups = args.setups.split(",")
    runs: dict[str, list] = {s: [] for s in setups}
    for r in range(args.rounds):
        for s in setups[r % len(setups):] + setups[:r % len(setups)]:  # each round starts one setup further on
            runs[s].append(run_once(*command(s, args)))
            print(f"round {r} {s}: {runs[s][-1]}", file=sys.stderr)
    out = {"model": args.model, "draft": args.draft, "max_new_tokens": args.max_new_tokens,
           "prompt_chars": len(args.prompt), "prompt_file": args.prompt_file,
           "max_context": args.max_context, "rounds": args.rounds, "home_extra_gb": home_extra_gb(), "setups": {}}
    for s, rs in runs.items():
        out["setups"][s] = {k: statistics.median(x[k] for x in rs) for k in ("first_token_s", "total_s", "peak_rss_gb")}
        out["setups"][s]["runs"] = rs
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
