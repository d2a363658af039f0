"""Wires models, drafter and engine from the settings a command gives (used by CLI, server and bench)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from specdec.config import GenerationConfig, LookaheadConfig, NgramConfig, SuffixConfig, TreeConfig
from specdec.drafters.base import Drafter, NoDrafter
from specdec.engine.generate import GenerationResult, SpeculativeGenerator
from specdec.errors import SpecdecError
from specdec.model import LoadedModel
from specdec.model.tokenizer import check_compatible, encode_prompt
from specdec.settings import DraftingSettings, ModelSettings


def log(msg: str) -> None:
    print(msg, file=sys.stderr)


def build_drafter(method: str, target: LoadedModel, capacity: int, draft: LoadedModel | None = None,
                  ngram: NgramConfig = NgramConfig(), draft_vocab: int = 0, p_min: float = 0.0,
                  tree: TreeConfig | None = None, suffix: SuffixConfig = SuffixConfig(),
                  lookahead: LookaheadConfig = LookaheadConfig(), draft_window: int = 0, head=None,
                  note=log) -> Drafter:
    """method: 'none', 'ngram', 'suffix', 'lookahead', 'draft' (then `draft` is the loaded draft
    model; `tree` makes it propose token trees instead of chains), 'hybrid' (the draft model and
    prompt lookup with the n-gram sizes of `ngram`), 'head' (`head`: an EAGLE or Medusa head
    loaded by load_head_for; `tree` makes EAGLE draft dynamic trees, Medusa its static choices) or
    'head-hybrid' (the head's chains and prompt lookup, as 'hybrid'). A draft model whose tokenizer
    differs from the target's drafts across tokenizers (CrossTokenizerDrafter), which `note` (a
    one-line log, or None) says."""
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
    if method == "head-hybrid" and head is not None:
        from specdec.drafters.hybrid import HybridDrafter
        return HybridDrafter(build_drafter("head", target, capacity, head=head), max_n=ngram.max_n, min_n=ngram.min_n)
    if method == "head" and head is not None:
        from specdec.drafters.eagle import EagleDrafter, MedusaDrafter, PreparedMedusa
        if isinstance(head, PreparedMedusa):
            if tree is not None and tree.choices is None:
                raise SpecdecError("a Medusa head drafts a static tree (--tree-choices), not --tree-budget")
            return MedusaDrafter(target.module, head, capacity, None if tree is None else tree.choices)
        return EagleDrafter(target.module, head, capacity, tree)
    if method in ("draft", "hybrid") and draft is not None:
        if same_tokenizer(target.tokenizer, draft.tokenizer):
            model = DraftModelDrafter(draft.module, target.module.config.vocab_size, capacity, draft_vocab, p_min,
                                      tree, draft_window)
        else:
            model = cross_tokenizer_drafter(target, draft, capacity, draft_vocab, p_min, tree, draft_window, note)
        if method == "draft":
            return model
        from specdec.drafters.hybrid import HybridDrafter
        return HybridDrafter(model, max_n=ngram.max_n, min_n=ngram.min_n)
    raise SpecdecError(f"unknown drafting method {method!r}; use none, ngram, suffix, lookahead, draft, hybrid, head or "
                       "head-hybrid")


def same_tokenizer(target_tok, draft_tok) -> bool:
    """The draft's ids are the target's (check_compatible passes)."""
    try:
        check_compatible(target_tok, draft_tok)
    except SpecdecError:
        return False
    return True


def cross_tokenizer_drafter(target: LoadedModel, draft: LoadedModel, capacity: int, draft_vocab: int, p_min: float,
                            tree: TreeConfig | None, window: int, note=log) -> Drafter:
    """A draft model with another tokenizer: its text is re-tokenized for the target (chains only)."""
    from specdec.drafters.cross_tokenizer import CrossTokenizerDrafter
    from specdec.drafters.text_bridge import bridge
    if tree is not None:
        raise SpecdecError(f"{draft.name} has another tokenizer than {target.name}: it drafts chains across "
                           "tokenizers, not trees; drop --tree-budget / --tree-choices or use a draft of the same "
                           "family")
    pair = bridge(target.tokenizer, draft.tokenizer)
    if note:
        note(f"drafting across tokenizers: {draft.name}'s text is re-tokenized for {target.name} "
             f"({pair.draft_per_target:.2f} draft tokens per target token on the probe text)")
    return CrossTokenizerDrafter(pair, draft.module, capacity, draft_vocab, p_min, window)


SHIPPED_HEADS = Path(__file__).resolve().parents[1] / "heads"  # trained heads committed beside the package


def load_head_for(name: str, target: LoadedModel, model_name: str, kind: str = "eagle"):
    """The head `name` (a directory, a name under $SPECDEC_HOME/heads, or 'auto': the `kind` head that
    `specdec train-head --model MODEL` writes, else the one this checkout ships for MODEL in heads/),
    checked against the target it drafts for, made ready to draft (PreparedHead for EAGLE, PreparedMedusa)."""
    from specdec.heads.checkpoint import load_head, target_fingerprint
    from specdec.heads.cli import default_out, heads_home
    path = default_out(model_name, kind) if name == "auto" else Path(name)
    shipped = SHIPPED_HEADS / path.name
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


def build_policy(drafter: Drafter, target: LoadedModel, k_max: int, cost_profile: str | None = None,
                 max_rows: int = 0, confidence: bool = True):
    """An AdaptivePolicy for this drafter: costs from a `specdec profile` JSON or measured now
    (v(n) up to n = max(k_max + 1, max_rows): a server measures up to max_batch (k_max + 1) rows)."""
    from specdec.drafters.draft_model import DraftModelDrafter
    from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig, load_profile
    from specdec.policy.measure import cached_costs
    if isinstance(drafter, NoDrafter):
        return None
    from specdec.drafters.hybrid import HybridDrafter
    from specdec.drafters.layer_skip import LayerSkipDrafter
    from specdec.drafters.cross_tokenizer import CrossTokenizerDrafter
    inner = drafter.model if isinstance(drafter, HybridDrafter) else drafter
    model = inner.model if isinstance(inner, (DraftModelDrafter, CrossTokenizerDrafter)) else None
    if cost_profile:
        costs = CostModel.from_profile(load_profile(cost_profile), "draft" if model else "lookup")
    else:
        top = max(k_max + 1, max_rows)
        sizes = {n for n in (1, 2, 3, 5, 9, 17, 33, 65, 129) if n <= top} | {k_max + 1, top}
        costs = cached_costs(target.module, model, sizes=sorted(sizes), progress=log)
    if isinstance(inner, CrossTokenizerDrafter):  # a target token costs this many of the draft's own tokens
        costs.draft_cost *= inner.draft_per_target
    if isinstance(drafter, LayerSkipDrafter):  # a draft token is a pass through L of the target's layers
        costs.draft_cost = len(drafter.layers) / target.module.config.num_layers
    if drafter.caps.features and not cost_profile and costs.step_seconds:  # a head: one entry, timed
        costs.draft_cost = drafter.step_seconds() / costs.step_seconds
    log(f"policy costs: v(n) {dict((n, round(v, 3)) for n, v in costs.verify_cost.items())}, "
        f"c {costs.draft_cost:.3f}, draft prefill {costs.prefill_fixed:.3f} + {costs.prefill_cost:.4f} per prompt token")
    return AdaptivePolicy(costs, PolicyConfig(k_max=k_max, confidence=confidence, **tree_actions(drafter)))


def policy_for(drafting: DraftingSettings, drafter: Drafter, target: LoadedModel):
    """--policy fixed: None; adaptive: the policy with its confidence rule; adaptive-k: k only."""
    if not drafting.adaptive:
        return None
    return build_policy(drafter, target, drafting.k, drafting.cost_profile, confidence=drafting.policy == "adaptive")


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
    def build(model: ModelSettings, drafting: DraftingSettings, cfg: GenerationConfig) -> "Runner":
        method = drafting.method
        if method == "layer-skip":
            return Runner.layer_skip(model, drafting, cfg)
        target = model.load(progress=log)
        draft = model.load(drafting.draft, draft=True, progress=log) if method in ("draft", "hybrid") else None
        head = load_head_for(drafting.head, target, model.model) if method in ("head", "head-hybrid") else None
        drafter = build_drafter(method, target, model.max_context, draft, drafting.ngram_config(),
                                drafting.draft_vocab, drafting.draft_p_min, drafting.tree_config(),
                                drafting.suffix_config(), drafting.lookahead_config(), drafting.draft_window, head)
        policy = policy_for(drafting, drafter, target)
        engine = SpeculativeGenerator(target.module, drafter, model.max_context, policy)
        k = drafting.k
        k_text = f"k<={k} adaptive" if policy else f"k={k}"
        label = f"draft {drafting.draft} {k_text}" if method == "draft" else (
            f"draft {drafting.draft} + prompt lookup {k_text}") if method == "hybrid" else (
            f"{method} {k_text}" if method in ("ngram", "suffix", "lookahead") else (
            f"{head.config.kind} head {drafting.head} {k_text}") if method == "head" else (
            f"{head.config.kind} head {drafting.head} + prompt lookup {k_text}") if method == "head-hybrid" else "plain")
        return Runner(target, engine, cfg, label)

    @staticmethod
    def layer_skip(model: ModelSettings, drafting: DraftingSettings, cfg: GenerationConfig) -> "Runner":
        """The target drafts for itself with its first L layers, writing into the engine's own cache."""
        from specdec.drafters.layer_skip import load_choice, make_layer_skip, parse_layer_spec
        spec = parse_layer_spec(drafting.layer_skip)
        if spec == "auto":
            spec = load_choice(drafting.layer_skip_file, model.model)
        target = model.load(progress=log)
        cache = target.module.new_cache(model.max_context)
        drafter = make_layer_skip(target.module, spec, model.max_context, cache)
        policy = policy_for(drafting, drafter, target)
        engine = SpeculativeGenerator(target.module, drafter, model.max_context, policy, cache=cache)
        return Runner(target, engine, cfg, f"layer-skip {drafter.spec} k={drafting.k}")

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
