"""Token trees as further actions (a mixin of AdaptivePolicy).

Trees: a drafter that can propose token trees (the draft model with a tree configuration) gives
the policy tree sizes as further actions. A tree of n nodes and depth D emits 1 + sum_{i<=D}
prod_{j<=i} gamma_{n,j} tokens for D c_tree + v(n + 1) time, with gamma_{n,i} the chance its
accepted path reaches depth i once it reached i - 1 (discounted Beta estimates per size and depth,
with an optimistic prior from the chain's estimate, so that an untried size gets tried; a tree's
outcome also feeds the pooled rate, so that the chain gets tried too), and c_tree the
measured draft cost per tree depth. The policy proposes the tree when it beats the best chain and
plain; trees are verified alone, so only at batch 1."""

from __future__ import annotations

from specdec.policy.costs import expected_tokens
from specdec.policy.estimates import Beta, CountView, cells


def _tree_view(name: str, doc: str) -> property:
    """A property that reads and sets one field of the policy's tree counts as {size: [float]}."""
    def get(self) -> CountView:
        return CountView(self.trees, name)

    def put(self, values: dict[int, list[float]]) -> None:
        CountView(self.trees, name).update(values)
    return property(get, put, doc=doc)


class Trees:
    """Per tree size, per depth: discounted counts of whether the accepted path reached that depth
    (`trees`, per request); the tree sizes' draft costs are calibrated (Calibration.tree_cost)."""

    tree_hits = _tree_view("hits", "{size: discounted passes per depth} (read and set)")
    tree_trials = _tree_view("trials", "{size: discounted observations per depth} (read and set)")

    def _reset_trees(self) -> None:
        self.trees: dict[int, list[Beta]] = {n: cells(self.cfg.tree_depth) for n in self.cfg.tree_sizes}

    def tree_beta(self, n: int) -> list[float]:
        """Per-depth acceptance of trees of n nodes: the chance the accepted path reaches depth i once
        it reached i - 1. Depth i's prior is optimistic, so that an untried size gets tried: as if
        each of the tree's m = n / depth candidates per level passed independently at the chain's
        rate b_i, 1 - (1 - b_i)^m (siblings are the draft's weaker alternatives, so the truth is
        lower, and a few observations correct it). Where higher, the next smaller size's estimate
        (more nodes only add paths) or depth i - 1's (as for chains) is the prior instead."""
        smaller = [m for m in self.cfg.tree_sizes if m < n]
        below = self.tree_beta(max(smaller)) if smaller else None
        chain, m = self.beta, max(1.0, n / max(self.cfg.tree_depth, 1))
        w, out = self.cfg.prior_weight, []  # a weak prior: an optimistic guess that observations must correct fast
        for i, cell in enumerate(self.trees[n]):
            b = chain[i] if i < len(chain) else self.pooled
            prior = max(1.0 - (1.0 - b) ** m, below[i] if below else 0.0, out[-1] if out else 0.0)
            out.append(cell.mean(prior, w))
        return out

    def tree_rate(self, n: int, depth: int) -> float:
        """Predicted tokens per unit time of a tree of n nodes and the given depth (alone, batch 1)."""
        seconds = self.rho_spec * self.costs.v(n + 1) + depth * self.tree_cost[n]
        return expected_tokens(self.tree_beta(n), depth) / seconds

    def _best_tree(self, k_cap: int, nodes_cap: int | None) -> tuple[int, int] | None:
        """(depth, n): the tree size that predicts more tokens per time than the best chain and plain
        (at batch 1), or None."""
        sizes = [n for n in self.cfg.tree_sizes if nodes_cap is None or n <= nodes_cap]
        if not sizes or k_cap <= 0 or self.cfg.schedule:
            return None
        depth = min(self.cfg.tree_depth, k_cap)
        k, chain_rate = self._best_k(self.beta, k_cap)
        bar = chain_rate if k else chain_rate * (1 + self.cfg.margin)  # a tree must clear plain's margin too
        rate, n = max((self.tree_rate(n, depth), n) for n in sizes)
        return (depth, n) if rate > bar * (1 + 1e-9) else None

    def observe_tree(self, n: int, depth: int, num_accepted: int) -> None:
        """A tree step's outcome: a tree of (at most) n nodes and this depth; its accepted path's length."""
        # The pooled rate (the chain's prior) learns from trees too: a tree's accepted path is at least
        # what a chain would have passed, so an optimistic chain estimate gets the chain tried, and
        # a policy that has only seen trees does not keep the chain at its starting prior forever.
        self._count(self.trees[n], depth, num_accepted)
        self.request_tokens += num_accepted + 1
        self.opening = self.opening_probe = self.probed = False
        self.plain_run = 0

