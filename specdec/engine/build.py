"""The one builder: loads the target and what the chosen drafters need (registry entries), once;
then builds drafters, policies (a policy's costs measured, or read from a profile, for this target,
and corrected by the drafter's own cost hints) and engines from those parts. generate
(runner.Runner), serve (server.build_scheduler), bench (bench.compare) and profile all start here."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from specdec.drafters.layer_skip import load_choice, parse_layer_spec
from specdec.drafters.registry import DEFAULT_HEAD_KIND, DraftOptions, Method, Parts, method
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from specdec.heads.find import load_head_for
from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig, load_profile
from specdec.policy.measure import cached_costs
from specdec.settings import DrafterKnobs, DraftingSettings, ModelSettings


def log(msg: str) -> None:
    print(msg, file=sys.stderr)


def layer_spec(model_name: str, knobs: DraftOptions):
    """--layer-skip: L, a layer list, or 'auto' (the choice `specdec tune-layer-skip` saved for the model)."""
    if knobs.layer_skip is None:
        raise SpecdecError("the layer-skip method needs --layer-skip L, a layer list, or 'auto' "
                           "(the choice `specdec tune-layer-skip` saved)")
    spec = parse_layer_spec(knobs.layer_skip)
    return load_choice(knobs.layer_skip_file, model_name) if spec == "auto" else spec


def head_name(options: DraftOptions) -> str:
    """--head names the EAGLE head (default 'auto'); other kinds are the ones trained for the model."""
    return options.head or "auto" if options.head_kind == DEFAULT_HEAD_KIND else "auto"


def load_parts(model: ModelSettings, methods: list[Method], options: DraftOptions, progress=log,
               share_cache: bool = True, defer_draft: bool = False) -> Parts:
    """The target, and the draft model, heads and layer-skip spec that any of `methods` needs; with
    share_cache, the target's cache that the engines (and layer skip's drafter) use. defer_draft: the
    draft model's weights are loaded when its drafter first starts, where they can be (load_model)."""
    target = model.load(progress=progress)
    drafts = any(m.entry.draft_model for m in methods)
    # the draft's LM head only for the ids it scores (--draft-vocab): the rest is never converted
    draft = model.load(options.draft, draft=True, progress=progress, beside=target,
                       head_rows=options.draft_vocab, defer=defer_draft) if drafts else None
    heads = {}
    for m in methods:
        if m.entry.head and m.head_kind not in heads:
            heads[m.head_kind] = load_head_for(head_name(m.options(options)), target, model.model, m.head_kind)
    layers = layer_spec(model.model, options) if any(m.entry.layers for m in methods) else None
    cache = target.module.new_cache(model.max_context) if share_cache else None
    return Parts(target, model.max_context, draft, heads, layers, cache)


def draft_options(knobs: DrafterKnobs, **more) -> DraftOptions:
    """The options every command's drafter knobs give (flags.add_drafter_knobs), and `more`."""
    return DraftOptions(head=knobs.head, layer_skip=knobs.layer_skip, layer_skip_file=knobs.layer_skip_file,
                        draft_vocab=knobs.draft_vocab, p_min=knobs.draft_p_min, window=knobs.draft_window,
                        drafters=dict(knobs.drafters), **more)


def drafting_options(drafting: DraftingSettings) -> DraftOptions:
    """generate's and serve's options (DraftingSettings)."""
    return draft_options(drafting, draft=drafting.draft, tree=drafting.tree_config())


@dataclass(frozen=True)
class EnginePlan:
    """How an engine drafts and how many requests it holds: k (the policy's largest), the adaptive
    policy or none (confidence: with its confidence rule), and the slots."""
    k: int = 4
    adaptive: bool = True
    confidence: bool = True
    cost_profile: str | None = None
    max_batch: int = 1
    prefill_chunk: int = 256
    prefix_cache: bool = False  # a server's choice; generate and bench prefill every prompt whole

    @staticmethod
    def of(drafting: DraftingSettings, **slots) -> "EnginePlan":
        """generate's and serve's plan: adaptive draws on the confidence rule, adaptive-k picks k only."""
        return EnginePlan(drafting.k, drafting.adaptive, drafting.policy == "adaptive", drafting.cost_profile,
                          **slots)


@dataclass
class Builder:
    """Loaded parts (load_parts) and the drafters' options: drafters, policies and engines for any
    method, so that generate, bench, profile and serve build alike."""
    parts: Parts
    options: DraftOptions

    @staticmethod
    def load(model: ModelSettings, methods: list[Method], options: DraftOptions, progress=log,
             share_cache: bool = True, defer_draft: bool = False) -> "Builder":
        return Builder(load_parts(model, methods, options, progress, share_cache, defer_draft), options)

    @staticmethod
    def from_settings(model: ModelSettings, drafting: DraftingSettings, progress=log,
                      share_cache: bool = True, defer_draft: bool = False) -> tuple["Builder", Method]:
        """generate's and serve's builder, and the method their settings name."""
        chosen = method(drafting.method)
        return Builder.load(model, [chosen], drafting_options(drafting), progress, share_cache, defer_draft), chosen

    @property
    def target(self):
        return self.parts.target

    def drafter(self, m: Method, note=log, options: DraftOptions | None = None):
        """A new drafter of method m; `note` (a one-line log, or None) hears how it drafts."""
        return m.build(self.parts, options or self.options, note)

    def label(self, m: Method, drafter, k_text: str) -> str:
        """How generate names what it runs: 'draft M k<=4 adaptive', 'plain'."""
        name = m.entry.label(self.parts, m.options(self.options), drafter)
        return f"{name} {k_text}" if m.entry.drafts else name

    def policy(self, drafter, k_max: int, cost_profile: str | None = None, max_batch: int = 1, confidence: bool = True):
        return build_policy(drafter, self.target, k_max, cost_profile, max_batch, confidence)

    def engine(self, m: Method, plan: EnginePlan, note=log, options: DraftOptions | None = None,
               drafter=None) -> Engine:
        """An engine of plan.max_batch slots drafting with method m (drafter: the first slot's, made
        already); each slot's policy starts from the same costs."""
        first = drafter if drafter is not None else self.drafter(m, note, options)
        policy = (self.policy(first, plan.k, plan.cost_profile, plan.max_batch, plan.confidence) if plan.adaptive
                  else None)
        if plan.max_batch == 1:
            return Engine(self.target.module, lambda: first, self.parts.capacity, 1,
                          (lambda: policy) if policy is not None else None, plan.prefill_chunk,
                          prefix_cache=plan.prefix_cache, cache=self.parts.cache)
        made = [first]

        def drafters():  # the first slot's is the one made; the others are built quietly
            return made.pop() if made else self.drafter(m, None, options)

        def policies():
            return policy.fresh()
        return Engine(self.target.module, drafters, self.parts.capacity, plan.max_batch,
                      policies if policy is not None else None, plan.prefill_chunk, prefix_cache=plan.prefix_cache)


def pool_sizes(max_batch: int) -> list[int]:
    """The row counts a pooled draft's d(n) is measured at: powers of two below max_batch, and max_batch."""
    return sorted({n for n in (2, 4, 8, 16, 32, 64) if n < max_batch} | {max_batch})


def build_policy(drafter, target, k_max: int, cost_profile: str | None = None, max_batch: int = 1,
                 confidence: bool = True):
    """An AdaptivePolicy for this drafter (None for plain decoding): costs from a `specdec profile`
    JSON or measured now (v(n) up to n = max(k_max + 1, max_batch (k_max + 1)); for a draft model or
    a head that drafts a server's rows together, d(n) at pool_sizes(max_batch)), corrected by the
    drafter's own cost hints (drafters/base.py)."""
    if not drafter.caps.drafts:
        return None
    model = drafter.cost_model()
    pools = pool_sizes(max_batch) if max_batch > 1 and drafter.caps.pooled else []  # a server's rows draft together
    if cost_profile:
        costs = CostModel.from_profile(load_profile(cost_profile), draft_model=model is not None)
    else:
        top = max_batch * (k_max + 1)
        sizes = {n for n in (1, 2, 3, 5, 9, 17, 33, 65, 129) if n <= top} | {k_max + 1, top}
        costs = cached_costs(target.module, model, sizes=sorted(sizes), progress=log,
                             batches=pools if model is not None else [])
    drafter.adjust_costs(costs, target, measured=not cost_profile)
    if pools and model is None and not cost_profile:  # a head times its own rows
        costs.draft_rows = drafter.row_costs(pools) or costs.draft_rows
    log(f"policy costs: v(n) {dict((n, round(v, 3)) for n, v in costs.verify_cost.items())}, "
        f"c {costs.draft_cost:.3f}, draft prefill {costs.prefill_fixed:.3f} + {costs.prefill_cost:.4f} per prompt token "
        f"+ {costs.prefill_quadratic:.2e} per token squared"
        + (f", pooled draft rows d(n) {dict((n, round(d, 3)) for n, d in costs.draft_rows.items())}"
           if len(costs.draft_rows) > 1 else ""))
    waiting = AdaptivePolicy.lookup_while_waiting(costs, k_max) if drafter.caps.lookup_only else None
    return AdaptivePolicy(costs, PolicyConfig(k_max=k_max, confidence=confidence, **drafter.tree_actions()), waiting)
