"""Wires models, drafter and engine from the few values a command gives (used by CLI and bench)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from specdec.config import GenerationConfig, LookaheadConfig, NgramConfig, SamplingParams, SuffixConfig, TreeConfig
from specdec.drafters.base import Drafter, NoDrafter
from specdec.engine.generate import GenerationResult, SpeculativeGenerator
from specdec.errors import SpecdecError
from specdec.model import LoadedModel, load_model, model_flags
from specdec.model.tokenizer import check_compatible, encode_prompt


def log(msg: str) -> None:
    print(msg, file=sys.stderr)


def build_drafter(method: str, target: LoadedModel, capacity: int, draft: LoadedModel | None = None,
                  ngram: NgramConfig = NgramConfig(), draft_vocab: int = 0, p_min: float = 0.0,
                  tree: TreeConfig | None = None, suffix: SuffixConfig = SuffixConfig(),
                  lookahead: LookaheadConfig = LookaheadConfig(), draft_window: int = 0, head=None) -> Drafter:
    """method: 'none', 'ngram', 'suffix', 'lookahead', 'draft' (then `draft` is the loaded draft
    model; `tree` makes it propose token trees instead of chains), 'hybrid' (the draft model and
    prompt lookup with the n-gram sizes of `ngram`) or 'head' (`head`: an EAGLE or Medusa head
    loaded by load_head_for; `tree` makes EAGLE draft dynamic trees, Medusa its static choices)."""
    from specdec.drafters.draft_model import DraftModelDrafter
    from specdec.drafters.ngram import NgramDrafter
    if draft_vocab < 0:
        raise SpecdecError(f"draft_vocab must be >= 0 (0 = full vocabulary), got {draft_vocab}")
    if method == "none":
        return NoDrafter()
    if method == "ngram":
        return NgramDrafter(ngram.max_n, ngram.min_n)
    if method == "suffix":
        from specdec.datastore import load_datastore, tokenizer_fingerprint
        from specdec.drafters.suffix import SuffixDrafter
        store = load_datastore(suffix.datastore, tokenizer_fingerprint(target.tokenizer)) if suffix.datastore else None
        return SuffixDrafter(suffix.cache_tokens, suffix.min_match, store)
    if method == "lookahead":
        from specdec.drafters.lookahead import LookaheadDrafter
        return LookaheadDrafter(lookahead.window, lookahead.ngram, lookahead.candidates)
    if method == "head" and head is not None:
        from specdec.drafters.eagle import EagleDrafter, MedusaDrafter, PreparedMedusa
        if isinstance(head, PreparedMedusa):
            if tree is not None and tree.choices is None:
                raise SpecdecError("a Medusa head drafts a static tree (--tree-choices), not --tree-budget")
            return MedusaDrafter(target.module, head, capacity, None if tree is None else tree.choices)
        return EagleDrafter(target.module, head, capacity, tree)
    if method in ("draft", "hybrid") and draft is not None:
        check_compatible(target.tokenizer, draft.tokenizer)
        model = DraftModelDrafter(draft.module, target.module.config.vocab_size, capacity, draft_vocab, p_min, tree,
                                  draft_window)
        if method == "draft":
            return model
        from specdec.drafters.hybrid import HybridDrafter
        return HybridDrafter(model, max_n=ngram.max_n, min_n=ngram.min_n)
    raise SpecdecError(f"unknown drafting method {method!r}; use none, ngram, suffix, lookahead, draft, hybrid or head")


def load_head_for(name: str, target: LoadedModel, model_name: str, kind: str = "eagle"):
    """The head `name` (a directory, a name under $SPECDEC_HOME/heads, or 'auto': the `kind` head that
    `specdec train-head --model MODEL` writes, else the one the package ships for MODEL), checked
    against the target it drafts for, made ready to draft (PreparedHead for EAGLE, PreparedMedusa)."""
    from pathlib import Path
    from specdec.heads.checkpoint import load_head, target_fingerprint
    from specdec.heads.cli import default_out, heads_home
    path = default_out(model_name, kind) if name == "auto" else Path(name)
    shipped = Path(__file__).parent / "data" / "heads" / path.name  # a head that comes with the package
    if name == "auto" and not path.is_dir() and shipped.is_dir():
        path = shipped
    if not path.is_dir() and (heads_home() / name).is_dir():
        path = heads_home() / name
    if not path.is_dir():
        raise SpecdecError(f"no head {name!r} (looked for the directory {path}); train one with `specdec train-head "
                           f"--model {model_name} --kind {kind} ...`, and `specdec heads` lists the installed ones")
    head, meta = load_head(path, target_fingerprint(target.module, target.tokenizer))
    from specdec.drafters.eagle import PreparedHead, PreparedMedusa
    if head.config.kind == "medusa":
        return PreparedMedusa(target.module, head)
    if head.config.kind != "eagle":
        raise SpecdecError(f"the head in {path} is an {head.config.kind} head; --head drafts with EAGLE and Medusa heads")
    return PreparedHead(target.module, head)


def drafting_method(args) -> str:
    """'none', 'ngram', 'suffix', 'lookahead', 'layer-skip', 'draft' or 'hybrid' (--draft with --ngram)
    from the CLI values; one at most, except that pair."""
    layer_skip = getattr(args, "layer_skip", None) is not None
    lookahead = getattr(args, "lookahead", False)
    head = getattr(args, "head", None) is not None
    chosen = [name for name, on in (("--ngram", args.ngram), ("--suffix", args.suffix), ("--lookahead", lookahead),
                                     ("--layer-skip", layer_skip), ("--draft", args.draft not in (None, "none")),
                                     ("--head", head))
              if on]
    if sorted(chosen) == ["--draft", "--ngram"]:
        return "hybrid"
    if len(chosen) > 1:
        raise SpecdecError(f"choose one drafting method; got {' and '.join(chosen)}")
    if args.datastore and not args.suffix:
        raise SpecdecError("--datastore is read by the suffix drafter; add --suffix")
    if head:
        return "head"
    return "ngram" if args.ngram else "suffix" if args.suffix else "lookahead" if lookahead else (
        "layer-skip") if layer_skip else (
        "none" if args.draft in (None, "none") else "draft")


def parse_choices(text: str) -> tuple[tuple[int, ...], ...]:
    """Medusa-style choices from JSON text or a JSON file: [[0], [1], [0, 0], ...]."""
    import json
    import os
    raw = open(text).read() if os.path.isfile(text) else text
    try:
        value = json.loads(raw)
    except ValueError:
        raise SpecdecError(f"--tree-choices must be a JSON list of rank paths like [[0], [1], [0, 0]], "
                           f"or a file holding one; got {text[:60]!r}") from None
    if not isinstance(value, list) or not all(isinstance(c, list) and all(isinstance(r, int) for r in c) for c in value):
        raise SpecdecError(f"--tree-choices must be a list of lists of integers, got {text[:60]!r}")
    from specdec.tree import choices_to_parents
    choices_to_parents(value)  # validates: empty, negative ranks, missing prefixes, duplicates
    return tuple(tuple(c) for c in value)


def lookahead_config(args) -> LookaheadConfig:
    return LookaheadConfig(getattr(args, "lookahead_window", 3), getattr(args, "lookahead_ngram", 3),
                           getattr(args, "lookahead_candidates", 3))


def tree_config(args) -> TreeConfig | None:
    """--tree-choices (static) or --tree-budget > 0 (dynamic), else None (chains)."""
    if getattr(args, "tree_choices", None):
        return TreeConfig(choices=parse_choices(args.tree_choices))
    if getattr(args, "tree_budget", 0):
        return TreeConfig(args.tree_budget, args.tree_depth, args.tree_topk)
    return None


def build_policy(drafter: Drafter, target: LoadedModel, k_max: int, cost_profile: str | None = None,
                 max_rows: int = 0, confidence: bool = True):
    """An AdaptivePolicy for this drafter: costs from a `specdec profile` JSON or measured now
    (v(n) up to n = max(k_max + 1, max_rows): a server measures up to max_batch (k_max + 1) rows)."""
    from specdec.drafters.draft_model import DraftModelDrafter
    from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig, load_profile, measure_costs
    if isinstance(drafter, NoDrafter):
        return None
    from specdec.drafters.hybrid import HybridDrafter
    from specdec.drafters.layer_skip import LayerSkipDrafter
    model = drafter.model if isinstance(drafter, DraftModelDrafter) else (
        drafter.model.model if isinstance(drafter, HybridDrafter) else None)
    if cost_profile:
        costs = CostModel.from_profile(load_profile(cost_profile), "draft" if model else "lookup")
    else:
        top = max(k_max + 1, max_rows)
        sizes = {n for n in (1, 2, 3, 5, 9, 17, 33, 65, 129) if n <= top} | {k_max + 1, top}
        costs = measure_costs(target.module, model, sizes=sorted(sizes))
    if isinstance(drafter, LayerSkipDrafter):  # a draft token is a pass through L of the target's layers
        costs.draft_cost = len(drafter.layers) / target.module.config.num_layers
    if drafter.caps.features and not cost_profile and costs.step_seconds:  # a head: one entry, timed
        costs.draft_cost = drafter.step_seconds() / costs.step_seconds
    log(f"policy costs: v(n) {dict((n, round(v, 3)) for n, v in costs.verify_cost.items())}, "
        f"c {costs.draft_cost:.3f}, draft prefill {costs.prefill_fixed:.3f} + {costs.prefill_cost:.4f} per prompt token")
    return AdaptivePolicy(costs, PolicyConfig(k_max=k_max, confidence=confidence, **tree_actions(drafter)))


def policy_from_args(args, drafter: Drafter, target: LoadedModel):
    """--policy fixed: None; adaptive: the policy with its confidence rule; adaptive-k: k only."""
    if not args.policy.startswith("adaptive"):
        return None
    return build_policy(drafter, target, args.k, args.cost_profile, confidence=args.policy == "adaptive")


def check_draft_flags(args) -> None:
    """The draft model's flags, checked before anything is loaded."""
    if not 0.0 <= args.draft_p_min < 1.0:
        raise SpecdecError(f"draft p_min must be in [0, 1), got {args.draft_p_min}")
    if args.draft_window < 0:
        raise SpecdecError(f"--draft-window must be >= 0 prompt tokens (0 = the whole prompt), got {args.draft_window}")


def tree_actions(drafter: Drafter) -> dict:
    """The tree sizes a draft-model drafter configured for trees offers the policy besides chains:
    powers of two below its node budget and the budget itself (a static tree: its own size), at
    its depth cap."""
    from specdec.drafters.draft_model import DraftModelDrafter, node_depths
    from specdec.drafters.eagle import EagleDrafter
    budget = drafter.caps.tree_nodes
    if not isinstance(drafter, (DraftModelDrafter, EagleDrafter)) or budget < 2:
        return {}
    if isinstance(drafter, DraftModelDrafter) and drafter.static is not None:
        return {"tree_sizes": (budget,), "tree_depth": max(node_depths(drafter.static[0]))}
    sizes = sorted({n for n in (4, 8, 16, 32, 64) if n < budget} | {budget})
    return {"tree_sizes": tuple(sizes), "tree_depth": drafter.tree.depth}


@dataclass
class Runner:
    target: LoadedModel
    engine: SpeculativeGenerator
    cfg: GenerationConfig
    method: str

    @staticmethod
    def from_args(args) -> "Runner":
        sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
        cfg = GenerationConfig(args.max_new_tokens, args.k, sampling)
        ngram = NgramConfig(args.ngram_max, args.ngram_min)
        if args.max_context < 1:
            raise SpecdecError(f"max_context must be >= 1, got {args.max_context}")
        check_draft_flags(args)
        method = drafting_method(args)
        if method == "layer-skip":
            return Runner.layer_skip(args, cfg)
        target = load_model(args.model, progress=log, **model_flags(args))
        draft = load_model(args.draft, progress=log, draft=True, **model_flags(args)) if method in ("draft", "hybrid") else None
        tree = tree_config(args)
        if tree is not None and method not in ("draft", "head"):
            raise SpecdecError("draft trees (--tree-budget / --tree-choices) need a draft model (--draft MODEL) "
                               "or an EAGLE head (--head)")
        head = load_head_for(args.head, target, args.model) if method == "head" else None
        drafter = build_drafter(method, target, args.max_context, draft, ngram, args.draft_vocab, args.draft_p_min,
                                tree, SuffixConfig(args.suffix_cache_tokens, args.suffix_min_match, args.datastore),
                                lookahead_config(args), args.draft_window, head)
        policy = policy_from_args(args, drafter, target)
        engine = SpeculativeGenerator(target.module, drafter, args.max_context, policy)
        k_text = f"k<={args.k} adaptive" if policy else f"k={args.k}"
        label = f"draft {args.draft} {k_text}" if method == "draft" else (
            f"draft {args.draft} + prompt lookup {k_text}") if method == "hybrid" else (
            f"{method} {k_text}" if method in ("ngram", "suffix", "lookahead") else (
            f"{head.config.kind} head {args.head} {k_text}") if method == "head" else "plain")
        return Runner(target, engine, cfg, label)

    @staticmethod
    def layer_skip(args, cfg: GenerationConfig) -> "Runner":
        """The target drafts for itself with its first L layers, writing into the engine's own cache."""
        from specdec.drafters.layer_skip import load_choice, make_layer_skip, parse_layer_spec
        if tree_config(args) is not None:
            raise SpecdecError("--layer-skip drafts chains; it does not take --tree-budget / --tree-choices")
        spec = parse_layer_spec(args.layer_skip)
        if spec == "auto":
            spec = load_choice(args.layer_skip_file, args.model)
        target = load_model(args.model, progress=log, **model_flags(args))
        cache = target.module.new_cache(args.max_context)
        drafter = make_layer_skip(target.module, spec, args.max_context, cache)
        policy = policy_from_args(args, drafter, target)
        engine = SpeculativeGenerator(target.module, drafter, args.max_context, policy, cache=cache)
        return Runner(target, engine, cfg, f"layer-skip {drafter.spec} k={args.k}")

    def generate(self, prompt: str, chat: bool = False, on_tokens=None) -> GenerationResult:
        ids = encode_prompt(self.target.tokenizer, prompt, chat)
        return self.engine.generate(ids, self.cfg, self.target.eos_ids, on_tokens)


def stream_printer(tokenizer):
    """A callback that prints newly accepted text as it arrives (decoding the whole output so far)."""
    seen: list[int] = []
    printed = [0]

    def on_tokens(new: list[int]) -> None:
        seen.extend(new)
        text = tokenizer.decode(seen, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next tokens
            return
        sys.stdout.write(text[printed[0]:])
        sys.stdout.flush()
        printed[0] = len(text)

    return on_tokens
