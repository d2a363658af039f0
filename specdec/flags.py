"""Every command's flags, in one place, and the frozen settings they become (specdec.settings).

The same flag means the same thing in generate, bench, serve and loadtest. Flag groups:
add_model_flags (ModelSettings), add_spec_flags (DraftingSettings), add_sampling_flags
(SamplingParams, and --max-new-tokens), add_serve_flags (ServeSettings), add_ray_flags (RaySettings),
add_bench_flags (BenchSettings), add_loadtest_flags (LoadtestSettings). `settings(cls, args)` builds
one from a parsed namespace, field by field: the namespace ends here and in the CLI.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import fields
from pathlib import Path

from specdec.config import LLAMA_ORDER, SAMPLER_ORDER
from specdec.constraints import ConstraintSpec
from specdec.drafters import registry
from specdec.settings import (API_KEY_ENV, DEFAULT_DRAFT, DEFAULT_DRAFT_VOCAB, DEFAULT_TARGET, DraftingSettings,
                              ModelSettings, RaySettings, ServeSettings)

__all__ = ["DEFAULT_DRAFT", "DEFAULT_DRAFT_VOCAB", "DEFAULT_TARGET", "integer", "settings"]


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def draft_bits(text: str) -> int | None:
    if text == "auto":
        return None
    if text not in ("3", "4", "8"):
        raise argparse.ArgumentTypeError(f"expected 3, 4, 8 or auto, got {text!r}")
    return int(text)


def positive(text: str) -> int:
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def settings(cls, args: argparse.Namespace):
    """cls (a settings dataclass) from the parsed flags of the same names; validated on construction.
    The drafters' own flags become `drafters` (name -> its settings) and their switches `switches`."""
    values = vars(args)
    special = {"drafters": lambda: registry.settings_from_flags(values),
               "switches": lambda: registry.switches_from_flags(values),
               "infill_vocab": lambda: None}  # SamplingParams': the server's, for llama-server's infill sampler
    return cls(**{f.name: special[f.name]() if f.name in special else values[f.name] for f in fields(cls)})


def add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_TARGET, help="target: registry name, .gguf path or HF directory")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default=None,
                   help="CUDA: bfloat16 (default), float16 or float32; the CPU runs float32 activations")
    p.add_argument("--max-context", type=integer, default=4096, help="KV cache capacity in tokens")
    p.add_argument("--threads", "-t", type=integer, default=None, metavar="N",
                   help="CPU threads for the kernels and torch, in this process (with --ray: in each replica) "
                        "(default: torch's, one per physical core; OMP_NUM_THREADS sets it too)")
    p.add_argument("--weight-dtype", default=None, choices=("auto", "gguf-q8", "gguf-q8-mapped", "float32"),
                   help="how the weights are read. gguf-q8: on the CPU, the GGUF file's own quantized blocks "
                        "(Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, IQ4_NL, IQ4_XS, IQ3_S) against activations quantized "
                        "to 8 bits per block (llama.cpp's arithmetic), all but IQ3_S repacked at load into tiles of 16 "
                        "output rows for the kernels (private memory, about the file's size; no fp32 copy); the "
                        "output is close to float32's, not equal (speculative output still equals plain "
                        "decoding's). gguf-q8-mapped: the same blocks read through the file's memory map as they "
                        "lie (pages shared between processes; slower prefill and verification). float32: the "
                        "torch reference, the weights dequantized to fp32 in memory at load (on CUDA: to "
                        "--dtype). auto (default): gguf-q8 for a .gguf model on the CPU, else the torch reference")
    p.add_argument("--draft-bits", type=draft_bits, default=None, metavar="{3,4,8,auto}",
                   help="a draft model's 32-weight and Q6_K blocks (Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, Q6_K) on the CPU backend: "
                        "4 re-encodes them at load as Q4_0 (half the bytes a draft step reads), 3 the same but the "
                        "MLP's gate and up as 3-bit Q3_0 (an eighth fewer bytes again), 8 keeps 8 bits (Q5_0 as "
                        "Q8_0); the output is exactly the target's at every width. auto (default): 3 with the x86 "
                        "kernels (AVX2 or AVX-512), 4 on ARM (not measured there)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="CUDA: replay decode and verify steps (up to 64 positions) as CUDA graphs, one per shape, "
                        "and a draft model's whole chain as one graph (one host sync a chain)")
    p.add_argument("--gpu-kernels", action="store_true",
                   help="CUDA: the small ops of steps up to 64 positions (norms with the residual add, RoPE with the "
                        "KV-cache write, attention, the SiLU gate) as Triton kernels, q/k/v and gate/up as one GEMM "
                        "each: ten launches a layer instead of about 45; with --cuda-graphs, ten a layer in the "
                        "graph. Llama-layout models (Llama, Qwen2/2.5, Qwen3, Mistral, SmolLM2, Phi-3); needs triton")


def add_drafter_knobs(p: argparse.ArgumentParser) -> None:
    """How the drafters are tuned: the same flags for generate and serve (DraftingSettings) and for
    bench's methods (BenchSettings), both settings.DrafterKnobs."""
    p.add_argument("--draft-vocab", type=integer, default=DEFAULT_DRAFT_VOCAB,
                   help="draft model scores only the first N token ids (0 = all); cuts its LM-head cost, output "
                        "stays exact (default: %(default)s, the measured best for the Qwen2.5 pair)")
    p.add_argument("--draft-p-min", type=float, default=0.0,
                   help="stop a draft early when the draft model's top probability is below this (0 = off)")
    p.add_argument("--draft-window", type=integer, default=0,
                   help="the draft model prefills only the prompt's last N tokens (0 = all): a long prompt's draft "
                        "prefill costs less, its drafts see less context; output stays exact")
    p.add_argument("--tree-depth", type=integer, default=4, help="dynamic tree: largest depth")
    p.add_argument("--tree-topk", type=integer, default=4,
                   help="dynamic tree: nodes expanded per depth, and children per expanded node")
    p.add_argument("--layer-skip", default=None, metavar="L|LAYERS|auto",
                   help="self-speculation: the target drafts with its first L layers (or a list like 0-5,8) and its "
                        "own head; 'auto' = the choice saved by `specdec tune-layer-skip` (bench: the layer-skip "
                        "method's layers)")
    p.add_argument("--layer-skip-file", default="runs/layer_skip.json", help="where tune-layer-skip saved its choices")
    p.add_argument("--head", default=None, metavar="DIR|NAME|auto",
                   help="draft with an EAGLE or Medusa head trained by `specdec train-head`: its directory, a name "
                        "under $SPECDEC_HOME/heads, or 'auto' (the one trained for --model; bench's eagle method "
                        "uses auto when this is not given)")
    p.add_argument("--cost-profile", default=None,
                   help="`specdec profile` JSON with v(n), c, the draft prefill's price (a fixed part + a part "
                        "per prompt token) and d(n) (a server's pooled draft over n rows) for the adaptive policy and bench's theory check (default: measured "
                        "on first use, kept per host, model pair and kernel build under $SPECDEC_HOME/costs)")
    registry.add_flags(p)  # each drafter's own, declared beside its class


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    """Which drafter generate and serve use, k, trees and the policy (DraftingSettings)."""
    p.add_argument("--draft", default=None,
                   help="draft model (registry name, .gguf or HF dir), 'self' (the target's own weights re-encoded "
                        "at load in --draft-bits: no second file), or 'none' for plain decoding. While the policy "
                        "holds the draft's prefill of a long prompt back, prompt lookup drafts. A draft with another "
                        "tokenizer drafts chains across tokenizers: its text is re-tokenized for the target")
    registry.add_switches(p)  # each drafter's on/off flag (--ngram, --suffix, --lookahead), declared beside its class
    p.add_argument("--k", type=integer, default=4,
                   help="draft tokens per verify step (--policy fixed), or the most the adaptive policy may draft")
    p.add_argument("--tree-budget", type=integer, default=0,
                   help="draft a dynamic token tree of at most N nodes (EAGLE-2 style) instead of a chain (0 = chain)")
    p.add_argument("--tree-choices", default=None,
                   help="static tree: Medusa-style rank paths as JSON (or a JSON file), e.g. '[[0],[1],[0,0],[0,1]]'")
    p.add_argument("--policy", choices=("fixed", "adaptive", "adaptive-k"), default="adaptive",
                   help="adaptive (default): pick k in 0..k each step from measured costs and running acceptance "
                        "(0 = plain step), and let a draft model's chain go on or end by its own confidence "
                        "(generate and every server slot alike); adaptive-k: pick k only; "
                        "fixed: draft k every step")
    p.add_argument("--drafter", default=None,
                   help="a registered drafter by name (any module of specdec/drafters/), instead of the flags above; "
                        "--draft, --head and --layer-skip still name the model, head or layers it uses")
    add_drafter_knobs(p)


def logit_bias(text: str) -> tuple[tuple[int, float], ...]:
    """--logit-bias 'ID=BIAS,ID=BIAS' -> ((id, bias), ...) in id order."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        token, sep, bias = item.partition("=")
        try:
            if not sep:
                raise ValueError
            pairs.append((int(token), float(bias)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected ID=BIAS pairs such as 198=-100,1234=2.5, got {item!r}") from None
    return tuple(sorted(pairs))


def sampler_order(text: str) -> tuple[str, ...]:
    """--samplers 'top_k,top_p,min_p,temperature' -> that order (those left out follow in the default one)."""
    named = [part.strip() for part in text.replace(";", ",").split(",") if part.strip()]
    bad = [n for n in named if n not in SAMPLER_ORDER]
    if bad or len(set(named)) != len(named):
        raise argparse.ArgumentTypeError(f"expected each of {','.join(SAMPLER_ORDER)} at most once, got {text!r}")
    return tuple(named + [n for n in SAMPLER_ORDER if n not in named])


def add_sampling_knobs(p: argparse.ArgumentParser) -> None:
    """top-k, top-p, min-p and the penalties (generate's and bench's: config.SamplingParams' fields)."""
    p.add_argument("--top-k", type=integer, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens below MIN_P x the top token's probability (0 = off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="a token seen in the prompt or the answer: its logit divided by this where positive, "
                        "multiplied where negative (1 = off)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtracted from the logit of each token the answer holds (-2..2, 0 = off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtracted once per time the answer holds the token (-2..2, 0 = off)")
    p.add_argument("--repeat-last-n", dest="penalty_last_n", type=integer, default=0, metavar="N",
                   help="count all three penalties over the last N tokens of the prompt and answer, as llama.cpp "
                        "does (0: the repetition penalty over the whole text, presence and frequency over the answer)")
    p.add_argument("--samplers", dest="order", type=sampler_order, default=SAMPLER_ORDER, metavar="NAMES",
                   help=f"the order the temperature and the cuts apply in (default: {','.join(SAMPLER_ORDER)}, "
                        f"vLLM's; llama.cpp's: {','.join(LLAMA_ORDER)}), after the bias and penalties")


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    add_sampling_knobs(p)
    p.add_argument("--logit-bias", type=logit_bias, default=(), metavar="ID=BIAS[,ID=BIAS...]",
                   help="added to those token ids' logits (-100..100; -100 bans a token). Bias and penalties "
                        "shape the target's logits by the text so far; speculation keeps plain decoding's output")
    p.add_argument("--seed", type=integer, default=None)
    p.add_argument("--max-new-tokens", type=positive, default=128)


def add_structure_flags(p: argparse.ArgumentParser) -> None:
    """generate's structured output: one of these, the answer generated under its grammar."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json-schema", default=None, metavar="SCHEMA",
                   help="the answer is JSON matching this JSON Schema (a file, or the JSON itself)")
    g.add_argument("--json-object", action="store_true", help="the answer is a JSON object")
    g.add_argument("--regex", default=None, help="the whole answer matches this regular expression")
    g.add_argument("--grammar", default=None, help="the answer follows this grammar, Lark or GBNF (a file, or its text)")
    g.add_argument("--choice", action="append", default=None, help="the answer is exactly one of these (repeat it)")


def structure_of(args: argparse.Namespace):
    """The ConstraintSpec the structure flags ask for (checked), or None."""
    spec = _structure_of(args)
    return spec.validate() if spec is not None else None


def _structure_of(args: argparse.Namespace):
    def text(value: str) -> str:  # a file's content, or the value itself
        path = Path(value)
        return path.read_text() if len(value) < 4096 and "\n" not in value and path.is_file() else value
    if args.json_schema is not None:
        return ConstraintSpec("json_schema", text(args.json_schema))
    if args.json_object:
        return ConstraintSpec("json_object")
    if args.regex is not None:
        return ConstraintSpec("regex", args.regex)
    if args.grammar is not None:
        return ConstraintSpec("grammar", text(args.grammar))
    if args.choice:
        return ConstraintSpec("choice", args.choice)
    return None


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    """The serve-only flags (ServeSettings; add_model_flags and add_spec_flags give the model and drafting ones)."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=integer, default=8000, help="port to listen on")
    p.add_argument("--max-batch", type=integer, default=4,
                   help="sequences generated at once (slots, each with its own KV cache of --max-context tokens)")
    p.add_argument("--max-queue", type=integer, default=64,
                   help="requests that may wait for a slot; beyond that the answer is 429 with Retry-After")
    p.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds a request may take, queueing included (finish_reason 'timeout'; 0 = none)")
    p.add_argument("--memory-budget-gb", type=float, default=None,
                   help="weights + KV caches + head-room must fit this (default: available memory at start "
                        "minus max(0.5 GiB, 10%%))")
    p.add_argument("--spec-off-batch", type=integer, default=None,
                   help="plain steps (no drafting) while more than N sequences are active")
    p.add_argument("--k-schedule", default=None,
                   help="draft length by active batch size, e.g. 1:4,4:2,8:0 (from 4 sequences k<=2, from 8 plain)")
    p.add_argument("--prefill-chunk", type=integer, default=256,
                   help="prompt tokens prefilled per step, so long prompts do not stall running sequences")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="prefill every prompt whole (default: a request reuses the keys/values a free slot holds of "
                        "its prompt's beginning, such as a conversation's earlier turns)")
    p.add_argument("--shutdown-grace", type=float, default=10.0,
                   help="on SIGTERM, seconds in-flight requests may still run before they end with 'abort'")
    p.add_argument("--served-model-name", default=None, help="the model id clients use (default: --model)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="every path but /health needs the header 'Authorization: Bearer KEY' or 'x-api-key: KEY' "
                        "(else 401); $SPECDEC_API_KEY gives it too, out of the process list (default: no key, all open)")
    p.add_argument("--api-key-protects-stats", action="store_true",
                   help="/stats and /metrics need the API key too (default: they stay open, for monitoring)")
    p.add_argument("--max-body-bytes", type=integer, default=4 * 1024 * 1024,
                   help="a request body longer than this is refused with 413 (default: 4 MiB)")
    p.add_argument("--max-stop-length", type=integer, default=256,
                   help="characters a stop string may have (a longer one is a 400)")
    p.add_argument("--max-messages", type=integer, default=512,
                   help="messages a chat request may have (more is a 400)")


def add_ray_flags(p: argparse.ArgumentParser) -> None:
    """Replicas on Ray Serve (RaySettings)."""
    ray = p.add_argument_group("replicas on Ray Serve (pip install -e '.[ray]')")
    ray.add_argument("--ray", action="store_true",
                     help="serve the same API from specdec replicas under Ray Serve, each a whole engine; a "
                          "conversation's turns go to the replica that served it while it has a free slot")
    ray.add_argument("--replicas", type=integer, default=None, help="--ray: replicas (default 2)")
    ray.add_argument("--autoscale", default=None, metavar="MIN:MAX", help="--ray: replicas scaled by load between MIN and MAX")
    ray.add_argument("--autoscale-delays", default="30:600", metavar="UP:DOWN",
                     help="--autoscale: seconds of load before a replica is added, and of idleness before one is "
                          "removed (default: Ray Serve's own, 30:600)")
    ray.add_argument("--ray-address", default=None,
                     help="--ray: join this Ray cluster (default: start a local one bound to loopback)")
    ray.add_argument("--cpus-per-replica", type=float, default=1.0, help="--ray: CPUs Ray reserves for each replica")
    ray.add_argument("--ray-routing", choices=("conversation", "least-loaded"), default="conversation",
                     help="--ray: a conversation's turns to the replica that served it while it has a free slot "
                          "(default), or Ray Serve's own least-loaded choice for every request")


def add_bench_flags(bench: argparse.ArgumentParser) -> None:
    """specdec bench's own flags (BenchSettings)."""
    bench.add_argument("--draft", default=DEFAULT_DRAFT,
                       help="draft model for the 'draft', 'tree', 'hybrid' and 'hf-assisted' methods")
    bench.add_argument("--methods", default="plain,draft,ngram,hf",
                       help="comma list from plain, draft, ngram, suffix, lookahead, layer-skip, tree, hybrid (ours; "
                            "tree:N is the draft model's dynamic token tree of N nodes, tree:auto lets the policy choose "
                            "plain, a chain or a tree of 4-16 nodes per step; hybrid is the draft model "
                            "plus prompt lookup; eagle and medusa draft with the heads trained for --model, see --head, and "
                            "eagle-tree:N with the EAGLE head's dynamic tree of N nodes; eagle-hybrid is the EAGLE head plus "
                            "prompt lookup; any drafter registered by name, as generate's --drafter, e.g. none, head), hf, "
                            "hf-assisted, hf-lookup "
                            "(HF transformers), llama, llama-spec, llama-lookup (llama.cpp's llama-server on the same "
                            "files: plain, its speculation with --draft at its defaults or pinned as llama-spec:K or "
                            "llama-spec:K@P (draft length, p_min), its prompt lookup); "
                            "a drafting method may pin its k, e.g. draft:8")
    bench.add_argument("--llama-bin", default=None,
                       help="llama.cpp's llama-server (or its directory) for the llama methods (default: "
                            "$SPECDEC_LLAMA_BIN, PATH, then the build of scripts/llama_cpp.sh build)")
    bench.add_argument("--dataset", default=None,
                       help="JSONL with 'prompt' or 'turns' (and optional 'category', 'id'); default: shipped code prompts")
    bench.add_argument("--limit", type=integer, default=None, help="first N prompts of each category")
    bench.add_argument("--categories", default=None, help="comma list of categories to run (default: all)")
    bench.add_argument("--k", default="2,auto",
                       help="draft tokens per step, or a sweep such as 1,2,3,4,6,8; 'auto' adds the adaptive "
                            "policy (k chosen per step in 0..8, and a draft model's chain lengthened or ended by "
                            "its calibrated confidence) for our drafting methods; 'auto-k': the k choice alone; "
                            "'auto4', 'auto-k4': either with 4 the largest k (default: %(default)s, the best fixed k measured in the default mode next to the policy)")
    add_drafter_knobs(bench)
    bench.add_argument("--max-new-tokens", type=positive, default=128)
    bench.add_argument("--temperature", type=float, default=0.0,
                       help="0 = greedy (outputs are checked token for token against plain decoding)")
    add_sampling_knobs(bench)
    bench.add_argument("--seed", type=integer, default=None, help="base seed for sampling (per prompt: seed + index)")
    bench.add_argument("--ignore-eos", action="store_true",
                       help="our methods generate exactly --max-new-tokens (EOS does not stop them), so sampled "
                            "runs compare equal amounts of work; not for the HF and llama.cpp peers")
    bench.add_argument("--repeats", type=integer, default=1, help="run everything N times; reports mean ± stdev")
    bench.add_argument("--theory", action="store_true",
                       help="print the predicted speedup (1-a^(k+1))/((1-a)(k c + v(k+1))) next to the measured one")
    bench.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    bench.add_argument("--report-only", action="store_true",
                       help="summarize the records already in --out (prompts every method finished); run nothing")
    bench.add_argument("--out", default="runs/bench",
                       help="output directory; a run there that was interrupted resumes where it stopped")


def add_loadtest_flags(p: argparse.ArgumentParser) -> None:
    """specdec loadtest's own flags (LoadtestSettings)."""
    p.add_argument("--draft", default=None, help="draft model for the 'on' and 'policy' modes")
    p.add_argument("--ngram", action="store_true", help="the 'on' and 'policy' modes draft by prompt lookup instead")
    p.add_argument("--draft-vocab", type=integer, default=32768,
                   help="the draft model scores only the first N token ids (0 = all; default: %(default)s, as serve)")
    p.add_argument("--modes", default="off,on,policy", help="comma list from off, on, policy")
    p.add_argument("--order", choices=("level", "mode"), default="level",
                   help="level: at each concurrency level run every mode (a fresh server each, order alternating "
                        "ABC, CBA), so drift between modes cancels; mode: one server per mode for all levels")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="client threads at once, per level")
    p.add_argument("--min-requests", type=integer, default=4, help="requests per level: max(this, 2 x concurrency)")
    p.add_argument("--max-tokens", type=integer, default=32)
    p.add_argument("--k", type=integer, default=4)
    p.add_argument("--max-batch", type=integer, default=16, help="the server's slots")
    p.add_argument("--dataset", default=None, help="JSONL prompts (Spec-Bench's question.jsonl works); first turns")
    p.add_argument("--categories", default=None, help="comma list of categories to use")
    p.add_argument("--completions", action="store_true",
                   help="send /v1/completions with the raw prompt (default: /v1/chat/completions, chat template)")
    p.add_argument("--timeout", type=float, default=900.0, help="client timeout per request, seconds")
    p.add_argument("--ray", action="store_true", help="drive `specdec serve --ray` (replicas under Ray Serve); "
                                                        "the table then shows requests answered per replica")
    p.add_argument("--replicas", type=integer, default=2, help="--ray: replicas")
    p.add_argument("--cpus-per-replica", type=float, default=1.0, help="--ray: CPUs per replica")
    p.add_argument("--out", default="runs/loadtest")


def add_all_serve_flags(p: argparse.ArgumentParser) -> None:
    """Everything `specdec serve` takes."""
    add_model_flags(p)
    add_spec_flags(p)
    add_serve_flags(p)
    add_ray_flags(p)


def serve_settings(args: argparse.Namespace) -> tuple:
    """(ModelSettings, DraftingSettings, ServeSettings, RaySettings) from `specdec serve`'s flags; the
    API key from $SPECDEC_API_KEY when --api-key is not given."""
    if args.api_key is None and os.environ.get(API_KEY_ENV):
        args = argparse.Namespace(**{**vars(args), "api_key": os.environ[API_KEY_ENV]})
    return tuple(settings(cls, args) for cls in (ModelSettings, DraftingSettings, ServeSettings, RaySettings))
