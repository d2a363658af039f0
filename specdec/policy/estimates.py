"""Acceptance estimates: discounted Beta counts (one type, `Beta`, for every rate the policy keeps)
and the per-position and pooled rates built from them.

Acceptance: beta_i is the probability that draft position i is accepted given that positions
1..i-1 were. Each position keeps discounted counts of what the verify steps showed (hits and trials,
both multiplied by 1 - decay before each new observation, so about 1/decay recent observations
count; positions after the first rejection show nothing), and beta_i is their Beta-posterior mean
(hits_i + w_pos prior_i) / (trials_i + w_pos). prior_i is the pooled rate of this request, or
beta_(i-1) where that is higher: acceptance given the chain got that far rarely drops with depth, so
after a chain accepted to its end the next position starts from the last one's rate, and k can grow
by more than one per passing step. The prior's weight w_pos (position_weight, 6 observations) keeps
one rejection at a deep position from cutting k for long when the pooled evidence is good. The pooled
rate is the same estimate over all positions (prior weight 2), with the prior carried from earlier
requests of this policy (a server slot or a bench method sees similar traffic; each request moves
it toward that request's whole acceptance record). A position a step did not reach loses its counts
at rate `relax` and so drifts back toward the pooled rate: an estimate that went low once is not
frozen because the policy stopped drafting that far. A plain step observes nothing, so every count
loses weight at rate `plain_relax` (slower after failed probes): the estimates drift back toward
the carried prior, and the policy looks again when a bad patch of text may have passed. A chain of
k drafts then emits E(k) = 1 + sum_{i<=k} prod_{j<=i} beta_j tokens per step (the i.i.d. case gives
(1 - a^(k+1)) / (1 - a)) for k c + v(k + 1) time. The policy takes the k with the best E(k) / time;
k = 0 is plain decoding (1 token per 1 time), and drafting must beat it by a margin (5%): at
break-even a prediction is as likely a loss as a gain, and real steps pay costs the model misses.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterator

CONF_EDGES = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 1.0)  # bins of a top probability


@dataclass
class Beta:
    """Discounted counts of a Beta estimate: `hits` passed of `trials` seen, older ones multiplied by
    keep (1 - decay) at each new observation."""

    hits: float = 0.0
    trials: float = 0.0

    def add(self, hits: float, trials: float = 1.0, keep: float = 1.0) -> None:
        """One observation (or a step's worth), after the old counts lose 1 - keep of their weight."""
        self.hits = keep * self.hits + hits
        self.trials = keep * self.trials + trials

    def fade(self, keep: float) -> None:
        """Every count loses 1 - keep of its weight (the estimate drifts back toward its prior)."""
        self.hits *= keep
        self.trials *= keep

    def mean(self, prior: float, weight: float) -> float:
        """The posterior mean with `weight` observations' worth of the prior mean `prior`."""
        return (self.hits + weight * prior) / (self.trials + weight)

    def rate(self) -> float:
        """The observed rate alone (0 where nothing was seen)."""
        return self.hits / self.trials if self.trials else 0.0


def blend(main: Beta, extra: Beta, extra_weight: float, prior: float, weight: float) -> float:
    """The posterior mean of main's counts plus extra_weight times extra's, with `weight`
    observations' worth of the prior mean `prior`."""
    return ((main.hits + extra_weight * extra.hits + weight * prior)
            / (main.trials + extra_weight * extra.trials + weight))


def cells(n: int) -> list[Beta]:
    return [Beta() for _ in range(n)]


def conf_bin(p: float) -> int:
    return min(bisect.bisect_right(CONF_EDGES, p) - 1, len(CONF_EDGES) - 2)


class Bins:
    """Beta estimates per bin of a probability p (CONF_EDGES), each with the bin's mid-point as its
    prior mean (a calibrated p)."""

    def __init__(self):
        self.cells = cells(len(CONF_EDGES) - 1)

    def count(self, p: float, passed: bool, keep: float) -> None:
        """One outcome into the bin of p, after its old counts lose 1 - keep of their weight."""
        self.cells[conf_bin(p)].add(1.0 if passed else 0.0, 1.0, keep)

    def rate(self, p: float, weight: float) -> float:
        """The bin's estimate, its mid-point counting as `weight` observations."""
        b = conf_bin(p)
        return self.cells[b].mean(0.5 * (CONF_EDGES[b] + CONF_EDGES[b + 1]), weight)


class CountView:
    """One field ("hits" or "trials") of {key: a row of Beta} as {key: [float]}: read and set."""

    def __init__(self, rows: dict[int, list[Beta]], name: str):
        self.rows, self.name = rows, name

    def __getitem__(self, key: int) -> list[float]:
        return [getattr(cell, self.name) for cell in self.rows[key]]

    def __setitem__(self, key: int, values: list[float]) -> None:
        for cell, x in zip(self.rows[key], values, strict=True):
            setattr(cell, self.name, x)

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def update(self, values: dict[int, list[float]]) -> None:
        for key, row in values.items():
            self[key] = row


class Acceptance:
    """The acceptance part of AdaptivePolicy (a mixin over its `cfg`): per-position counts, the pooled
    counts over all positions, plain steps' predicted acceptance (`shadow`, see observe_target), this
    request's undiscounted record and the prior it carries to the next request."""

    def _reset_acceptance(self) -> None:
        """A new request's counts (the carried prior stays)."""
        self.positions = cells(self.cfg.k_max)  # per draft position (beta_i)
        self.pool = Beta()  # the same over all positions
        self.shadow = Beta()  # plain steps' predicted acceptance (discounted)
        self.request = Beta()  # this request's drafted outcomes, undiscounted (for the next prior)
        self.request_shadow = Beta()  # this request's plain steps' predicted acceptance, undiscounted

    def _carry_prior(self) -> None:
        """A request ended: its whole record (plain steps relax the running counts), its plain steps'
        predicted acceptance included, moves the prior: a request that ran plain still tells the next one."""
        if self.request.trials > 0 or self.request_shadow.trials > 0:
            rate = blend(self.request, self.request_shadow, self.cfg.shadow_weight, self.prior,
                         self.cfg.prior_weight)
            self.prior += self.cfg.memory * (rate - self.prior)

    @property
    def pooled(self) -> float:
        """This request's rate: its drafted steps' outcomes, its plain steps' predicted acceptance
        (shadow_weight each) and the carried prior."""
        return blend(self.pool, self.shadow, self.cfg.shadow_weight, self.prior, self.cfg.prior_weight)

    @property
    def beta(self) -> list[float]:
        """Per-position estimates. Position i's prior is the pooled rate, or position i-1's estimate
        where that is higher: a chain accepted to its end says little about the next position by
        count, but acceptance given the chain got that far rarely drops with depth, and the deeper
        positions are only observed once the policy drafts that far."""
        w, pooled, out = self.cfg.position_weight, self.pooled, []
        for cell in self.positions:
            prior = max(pooled, out[-1]) if out else pooled
            out.append(cell.mean(prior, w))
        return out

    def _count(self, row: list[Beta], drafted: int, num_accepted: int) -> None:
        """One step's outcome into discounted per-position counts (positions 1..accepted passed, the
        next one, if drafted, failed; unreached positions drift toward the pooled rate) and into
        the pooled counts."""
        keep = 1.0 - self.cfg.decay
        reached = min(drafted, num_accepted + 1, len(row))
        for i, cell in enumerate(row):
            if i < reached:
                cell.add(1.0 if i < num_accepted else 0.0, 1.0, keep)
            else:
                cell.fade(1.0 - self.cfg.relax)
        self.pool.add(min(num_accepted, reached), reached, keep)
        self.request.add(min(num_accepted, reached), reached)

    def _fade_positions(self, keep: float) -> None:
        """A plain step: every position's and the pooled counts lose 1 - keep of their weight."""
        for cell in self.positions:
            cell.fade(keep)
        self.pool.fade(keep)

    def assume(self, beta: list[float], weight: float = 1000.0) -> None:
        """Set the per-position estimates as if `weight` observations had shown `beta` (tests, warm starts)."""
        for i, b in enumerate(beta[: self.cfg.k_max]):
            self.positions[i] = Beta(b * weight, weight)

    @property
    def hits(self) -> list[float]:
        """Discounted accepted observations per position."""
        return [cell.hits for cell in self.positions]

    @property
    def trials(self) -> list[float]:
        """Discounted observations per position."""
        return [cell.trials for cell in self.positions]

    @property
    def shadow_trials(self) -> float:
        return self.shadow.trials

    @property
    def request_shadow_trials(self) -> float:
        return self.request_shadow.trials
