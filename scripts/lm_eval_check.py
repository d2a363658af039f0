"""lm-evaluation-harness against `specdec serve`: a multiple-choice task scored through the server's logprobs.

Starts the server (SmolLM2-135M with n-gram drafting by default) on a loopback port, writes a small
multiple-choice task from a local JSONL file, and runs lm-evaluation-harness's `local-completions` model
on it (`echo` + `logprobs`), tokenizing through the server's /tokenize, /detokenize and /tokenizer_info
(`tokenizer_backend=remote`): no tokenizer files, no network. Then it scores every (context, choice)
pair with the engine itself (the prompt's logprobs of one generate call, no server) and checks that
each log-likelihood lm-eval got equals the engine's within --tolerance, and so does its is-greedy flag.

    .venv/bin/pip install lm_eval
    .venv/bin/python scripts/lm_eval_check.py [--model smollm2-135m-instruct] [--jsonl FILE]

Exit 0 when every log-likelihood matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

QUESTIONS = [
    {"question": "The capital of France is", "choices": ["Paris", "Berlin", "Madrid", "Rome"], "answer": 0},
    {"question": "Two plus two equals", "choices": ["three", "four", "five"], "answer": 1},
    {"question": "The opposite of hot is", "choices": ["warm", "cold", "loud"], "answer": 1},
    {"question": "Water freezes at zero degrees", "choices": ["Celsius", "Kelvin", "Fahrenheit"], "answer": 0},
    {"question": "A week has seven", "choices": ["days", "months", "hours"], "answer": 0},
    {"question": "def add(a, b):\n    return", "choices": ["a + b", "a - b", "print(a)"], "answer": 0},
]

TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {jsonl}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def serve(args):
    """The server on a free loopback port in a thread: (base url, scheduler, uvicorn server, thread)."""
    from specdec.flags import add_all_serve_flags, serve_settings
    from specdec.server import build_scheduler
    from specdec.server.app import create_app, make_server
    p = argparse.ArgumentParser()
    add_all_serve_flags(p)
    flags = ["--model", args.model, "--max-context", "1024", "--max-batch", "2"] + args.drafting.split()
    model, drafting, srv = serve_settings(p.parse_args(flags))[:3]
    sched = build_scheduler(model, drafting, srv, progress=lambda m: None)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = make_server(create_app(sched, "specdec"), sched, "127.0.0.1", sock.getsockname()[1],
                         log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise SystemExit("the server did not start")
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", sched, server, thread


def run_lm_eval(base: str, jsonl: Path, workdir: Path) -> list[dict]:
    """lm-eval's local-completions over the task; its samples (one per document)."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    name = "specdec_mc_check"
    (workdir / f"{name}.yaml").write_text(TASK_YAML.format(name=name, jsonl=jsonl))
    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"model": "specdec", "base_url": f"{base}/v1/completions", "tokenizer_backend": "remote",
                    "num_concurrent": 1, "max_retries": 1, "batch_size": 1, "max_length": 1024},
        tasks=[name], task_manager=TaskManager(include_path=str(workdir)), log_samples=True)
    print(json.dumps(out["results"][name], indent=1, default=str))
    return out["samples"][name]


def pairs_of(sample: dict) -> list[tuple[str, str, float, bool]]:
    """(context, continuation, log-likelihood, is greedy) of each choice lm-eval scored for a document."""
    out = []
    for arg, resp in zip(sample["arguments"], sample["resps"]):
        if isinstance(arg, dict):  # {"gen_args_0": {"arg_0": context, "arg_1": continuation}}
            arg = list(arg.values())[0]
            arg = (arg["arg_0"], arg["arg_1"])
        ll, greedy = resp[0]
        out.append((arg[0], arg[1], float(ll), bool(greedy)))
    return out


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split of a (context, continuation) pair into ids: trailing spaces move to the continuation,
    the whole is encoded once and the context's ids are cut off its front."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    ctx = tokenizer.encode(context, add_special_tokens=False)
    return ctx, whole[len(ctx):]


def engine_score(sched, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """The engine's own log-likelihood of the continuation after the context, and whether it is greedy."""
    from specdec.config import GenerationConfig
    from specdec.drafters.base import NoDrafter
    from specdec.engine.engine import Engine
    engine = Engine.single(sched.engine.target, NoDrafter(), 1024)
    r = engine.generate(context + continuation, GenerationConfig(1, 1, logprobs=1, prompt_logprobs=True))
    scored = r.prompt_logprobs[len(context):]
    return sum(s.logprob for s in scored), all(s.top[0][0] == s.token for s in scored)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--drafting", default="--ngram", help="the server's drafting flags, as one string")
    p.add_argument("--jsonl", default=None, help="the task's documents: {question, choices, answer} per line "
                                                 "(default: a few built-in ones)")
    p.add_argument("--tolerance", type=float, default=1e-3, help="largest |lm-eval - engine| per log-likelihood")
    args = p.parse_args()
    base, sched, server, thread = serve(args)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            jsonl = Path(args.jsonl).resolve() if args.jsonl else Path(tmp) / "questions.jsonl"
            if not args.jsonl:
                jsonl.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
            samples = run_lm_eval(base, jsonl, Path(tmp))
    finally:
        server.should_exit = True
        thread.join(30)
    worst, bad, n = 0.0, 0, 0
    for sample in samples:
        for context, continuation, ll, greedy in pairs_of(sample):
            ctx, cont = encode_pair(sched.tokenizer, context, continuation)
            own, own_greedy = engine_score(sched, ctx, cont)
            diff = abs(own - ll)
            worst, n = max(worst, diff), n + 1
            ok = diff <= args.tolerance and own_greedy == greedy
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {context!r} + {continuation!r}: lm-eval {ll:.5f} ({greedy}), "
                  f"engine {own:.5f} ({own_greedy})")
    print(f"{n} log-likelihoods, {bad} differ; largest difference {worst:.2e} (tolerance {args.tolerance})")
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
