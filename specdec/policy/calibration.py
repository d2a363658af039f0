"""Calibration of the cost model by measured seconds (a mixin of AdaptivePolicy).

Calibration: the offline curve times bare forwards at one context length. A real step also pays a
longer or shorter context, the draft model's catch-up on accepted tokens, sampling and host work.
When the cost model knows the plain step in seconds (`step_seconds`, t1), the engine reports each
step's measured draft and verify seconds, and the policy keeps three moving averages in t1 units:
rho_v, measured over predicted seconds of plain steps; rho_spec, the same for drafted steps (a
multi-position verify: sampled verification's softmax over the vocabulary at every position, for
one, makes it dearer relative to a plain step than the bare forwards say); and c_eff, the measured
draft seconds per draft token (drafting steps that follow a drafting step of the same request: a
probe also pays the catch-up on the plain steps' tokens, and a request's first drafting step a
head's catch-up on the whole prompt). A step of k then costs rho_spec v(k + 1) + k c_eff against
rho_v for plain, so a drafter dearer than the curve says loses its steps to plain decoding, and a
longer context alone (which slows both alike) does not. A plain step of a plain run that moves
rho_v moves every drafting price (rho_spec, c_eff, the prefill's scale) by the same factor: a host
that slows down slows every kind of step, so a slow spell seen while plain must not make drafting
look cheap. The calibration carries over to the next request. rho_spec is measured only on drafted
steps, so once drafting has stopped (probe_every plain steps in a row) each plain step moves it a
plain_relax share back toward rho_v, the curve's own ratio: a slow spell that made verifies look dear cannot lock drafting (and its probes) out for good.
Costs read from the cache ($SPECDEC_HOME/costs, measure.cached_costs) are not checked at start: plain
steps that run RECHECK times faster than the entry's mark it stale, and the next start measures anew.
"""

from __future__ import annotations

from specdec.policy.measure import RECHECK, mark_stale


class Calibration:
    """Measured over predicted seconds, in plain-step units, kept across requests: rho_v (plain
    steps' forwards), rho_spec (drafted steps' verify forwards), draft_cost (c_eff, per draft
    forward), tree_cost (per tree depth, per size) and rho_prefill (the drafter's prefill)."""

    def _start_calibration(self) -> None:
        self.rho_v = 1.0  # measured / predicted seconds of plain steps' forwards (EMA)
        self.rho_spec = 1.0  # the same for drafted steps' verify forwards (EMA)
        self.draft_cost = self.costs.draft_cost  # c_eff: measured draft seconds per draft token / t1 (EMA)
        # the last 3 measurements of each (seeded with the starting values): the EMAs take their median,
        # so one stalled step (a verify that runs 4x slow) does not turn drafting off
        self.recent = {"rho_v": [1.0, 1.0], "rho_spec": [1.0, 1.0], "draft_cost": [self.draft_cost] * 2}
        # trees: measured draft seconds per tree depth / t1 (EMA), per tree size
        self.tree_cost = {n: self.costs.draft_cost for n in self.cfg.tree_sizes}
        self.rho_prefill = 1.0  # measured / predicted seconds of the drafter's prefill (EMA over requests)

    def _median3(self, name: str, x: float) -> float:
        """The median of this and the last two measurements of `name`: one outlier is dropped, a
        lasting change passes from its second measurement on."""
        window = self.recent[name]
        window.append(x)
        del window[:-3]
        return sorted(window)[1]

    def _host_moved(self, f: float) -> None:
        """A plain step of a plain run moved rho_v by the factor f. A host that slowed down (or sped up)
        changes every kind of step alike, so every drafting price, in the same absolute units, moves with
        it: rho_spec, the draft costs and the prefill's scale, and the measurements their medians are
        taken over. Else a slow spell seen only by plain steps makes drafting look cheap (plain steps at
        3.9x their predicted time once started a draft model that lost). While drafting, the
        drafted steps measure those prices themselves. Drafted steps do not move rho_v in turn:
        plain steps are not measured while drafting, so a drafted step dearer than the curve says would
        then keep plain decoding looking dear for good; the other way round, probes correct it."""
        if f == 1.0:
            return
        self.rho_spec *= f
        self.draft_cost *= f
        self.rho_prefill *= f
        self.tree_cost = {n: c * f for n, c in self.tree_cost.items()}
        for name in ("rho_spec", "draft_cost"):
            self.recent[name] = [x * f for x in self.recent[name]]

    def observe_time(self, k: int, draft_seconds: float | None, verify_seconds: float, batch: int = 1,
                     width: int | None = None, nodes: int | None = None, pooled: int = 1) -> None:
        """A step's measured draft and verify seconds (this sequence's share of a batched verify, whose
        rows were padded to `width` positions, default k + 1, and of the drafting of the `pooled` rows that
        drafted together); draft_seconds None = not measured.
        nodes: the step was a tree of that size (its verify covered nodes + 1 positions, its k is
        its depth). Calibrates rho_v and c_eff (for a tree: that size's draft cost per depth)."""
        t1 = self.costs.step_seconds
        if not self.cfg.calibrate or not t1 or verify_seconds <= 0:
            return
        d = self.cfg.calibration_decay
        predicted = t1 * self.costs.v(nodes + 1 if nodes else batch * (width or k + 1)) / (1 if nodes else batch)
        ratio = min(max(verify_seconds / predicted, 0.25), 4.0)  # one outlier (a GC pause) must not flip it
        if nodes or (width or k + 1) > 1:  # a multi-position verify (a padded batch row's too)
            self.rho_spec = (1 - d) * self.rho_spec + d * self._median3("rho_spec", ratio)
        else:
            before, live = self.rho_v, self._median3("rho_v", ratio)
            self.rho_v = (1 - d) * self.rho_v + d * live
            if live * RECHECK < 1:  # two of the last three plain steps: a cached entry came from a busy
                mark_stale(self.costs)  # host; the next start measures again
            if self.plain_run > 1:  # in a plain run: the drafting prices were last measured steps ago
                self._host_moved(self.rho_v / before)
            if self.plain_run >= self.cfg.probe_every:
                # rho_spec is measured only while drafting. Once drafting has stopped, let it drift back toward
                # the curve's verify/plain ratio: a slow spell of the host that inflated it must not lock drafting
                # out for good (no probe runs while even a 0.9 drafter is predicted to lose)
                self.rho_spec += self.cfg.plain_relax * (self.rho_v - self.rho_spec)
        if nodes and k > 0 and draft_seconds is not None:
            c = min(max(draft_seconds / (t1 * k), 0.0), 4.0)
            self.tree_cost[nodes] = (1 - d) * self.tree_cost[nodes] + d * c
        elif max(k, self.last_looked) > 0 and draft_seconds is not None and not (self.probed or self.first_draft):
            # per draft forward of one row: this row's share of a pooled forward over `pooled` rows is d(pooled) / pooled
            share = draft_seconds * pooled / self.costs.d(pooled)
            c = min(max(share / (t1 * max(k, self.last_looked)), 0.0), 4.0)
            self.draft_cost = (1 - d) * self.draft_cost + d * self._median3("draft_cost", c)

    def observe_prefill(self, prompt_len: int, seconds: float) -> None:
        """The drafter's measured prefill of a prompt: calibrates the prefill cost admission uses."""
        t1 = self.costs.step_seconds
        if not self.cfg.calibrate or not t1 or not self.costs.charges_prefill or prompt_len < 1 or seconds <= 0:
            return
        ratio = min(max(seconds / (t1 * self.costs.prefill(prompt_len)), 0.25), 4.0)
        d = self.cfg.calibration_decay
        self.rho_prefill = (1 - d) * self.rho_prefill + d * ratio
