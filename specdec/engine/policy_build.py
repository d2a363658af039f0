"""The adaptive policy for a drafter: its costs measured (or read from a profile) for this target."""

from __future__ import annotations

from specdec.engine.build import log


def build_policy(drafter, target, k_max: int, cost_profile: str | None = None, max_rows: int = 0,
                 confidence: bool = True):
    """An AdaptivePolicy for this drafter (None for plain decoding): costs from a `specdec profile`
    JSON or measured now (v(n) up to n = max(k_max + 1, max_rows): a server measures up to
    max_batch (k_max + 1) rows)."""
    from specdec.drafters.base import NoDrafter
    from specdec.drafters.cross_tokenizer import CrossTokenizerDrafter
    from specdec.drafters.draft_model import DraftModelDrafter
    from specdec.drafters.hybrid import HybridDrafter
    from specdec.drafters.layer_skip import LayerSkipDrafter
    from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig, load_profile
    from specdec.policy.measure import cached_costs
    if isinstance(drafter, NoDrafter):
        return None
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


def tree_actions(drafter) -> dict:
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
