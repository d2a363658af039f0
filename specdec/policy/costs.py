"""Costs of the policy's actions, in plain decode steps of the target (one plain step = 1), and the
`specdec profile` JSON they come from.

- verifying n positions costs v(n) (v(1) = 1), measured once per model (`measure_costs`) or taken
  from a `specdec profile` JSON;
- one draft token costs c (the draft model's step over the target's; about 0 for lookup drafters);
- a pooled draft forward over n rows (a server's slots drafting together) costs c d(n), d(1) = 1, measured
  for a draft model that pools; else d(n) = n (each row drafts on its own);
- the drafter's prefill of n prompt tokens costs prefill_fixed + prefill_cost n + prefill_quadratic n^2 (a draft
  model; 0 for lookup drafters): the square is attention's, which a 1-2k-token prompt makes count.

A chain of k drafts emits E(k) = 1 + sum_{i<=k} prod_{j<=i} beta_j tokens per step (beta_j: the
acceptance estimates, see estimates.py) for k c + v(k + 1) time; best_k takes the k with the best
E(k) / time, k = 0 being plain decoding (1 token per 1 time), which drafting must beat by a margin.

Batch awareness: with B sequences in a verify pass the target reads its weights once for B (k + 1)
rows, so plain costs v(B) for B tokens and a chain costs k c d(B) + v(B (k + 1)) for B E(k) tokens
(a pooled draft model reads its weights once a position for all B rows too: d(B) well under B);
above a measured critical batch no k pays. A fixed schedule {batch size: k} (vLLM's
num_speculative_tokens_per_batch_size) overrides the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from specdec.errors import SpecdecError


def interpolate(curve: dict[int, float], n: int) -> float:
    """Piecewise-linear v(n) through the measured points; linear extrapolation past the last two."""
    xs = sorted(curve)
    if n <= xs[0]:
        return curve[xs[0]]
    for lo, hi in zip(xs, xs[1:]):
        if lo <= n <= hi:
            return curve[lo] + (curve[hi] - curve[lo]) * (n - lo) / (hi - lo)
    if len(xs) == 1:
        return curve[xs[0]] * n
    lo, hi = xs[-2], xs[-1]
    return curve[hi] + (curve[hi] - curve[lo]) * (n - hi) / (hi - lo)


@dataclass
class CostModel:
    verify_cost: dict[int, float]  # n positions -> time relative to one plain step; v(1) = 1
    draft_cost: float = 0.0  # c: one draft token relative to one plain target step
    step_seconds: float | None = None  # one plain step in seconds, where measured (enables calibration)
    prefill_cost: float = 0.0  # the drafter's prefill per prompt token, relative to one plain step
    prefill_fixed: float = 0.0  # and per prefill forward, whatever its length (reading the weights, small-M GEMMs)
    prefill_quadratic: float = 0.0  # and per token squared (attention over the prompt so far)
    # n rows of a pooled draft forward -> time relative to one row (d(1) = 1); {1: 1.0} alone: n rows cost n
    draft_rows: dict[int, float] = field(default_factory=lambda: {1: 1.0})
    source: str | None = field(default=None, compare=False)  # the cache file these were read from (measure.py)

    def __post_init__(self):
        if not self.verify_cost or 1 not in self.verify_cost:
            raise SpecdecError("a cost model needs v(1) among its verify costs")
        if self.draft_rows.get(1) != 1.0 or any(n < 1 or d <= 0 for n, d in self.draft_rows.items()):
            raise SpecdecError(f"a pooled draft's row costs need d(1) = 1 and positive values, got {self.draft_rows}")
        if (any(n < 1 or v <= 0 for n, v in self.verify_cost.items()) or self.draft_cost < 0
                or self.prefill_cost < 0 or self.prefill_fixed < 0 or self.prefill_quadratic < 0):
            raise SpecdecError(f"costs must be positive: v={self.verify_cost}, c={self.draft_cost}, "
                               f"prefill {self.prefill_fixed} + {self.prefill_cost} per token + "
                               f"{self.prefill_quadratic} per token squared")

    def v(self, n: int) -> float:
        return interpolate(self.verify_cost, n)

    def d(self, n: int) -> float:
        """A pooled draft forward over n rows, in one row's forwards."""
        return interpolate(self.draft_rows, n)

    @property
    def charges_prefill(self) -> bool:
        """Whether the drafter prefills at a cost (a draft model; lookup drafters do not)."""
        return self.prefill_fixed > 0 or self.prefill_cost > 0 or self.prefill_quadratic > 0

    def prefill(self, n: int) -> float:
        """The drafter's prefill of n tokens in plain steps: a fixed part per forward plus a part per
        token. A short prompt's prefill is mostly the fixed part (the weights are read once however
        few the rows), so pricing by the token alone makes it look cheap, and a calibration
        measured on short prompts then overprices long ones, and the reverse. Attention over the
        prompt adds a part per token squared: a 2k-token prefill of the 0.5B draft costs twice what
        the affine part fitted on short prompts says."""
        return self.prefill_fixed + self.prefill_cost * n + self.prefill_quadratic * n * n if n > 0 else 0.0

    def step_time(self, k: int, batch: int = 1) -> float:
        return k * self.draft_cost * self.d(batch) + self.v(batch * (k + 1))

    @staticmethod
    def from_profile(data: dict, *, draft_model: bool = True) -> "CostModel":
        """The costs a `specdec profile` JSON measured; its draft model's (c, the prefill's price) only for a
        drafter that drafts with a model (drafters.base.BaseDrafter.cost_model() is not None), else a lookup's."""
        curve = {int(n): float(v) for n, v in data["verify_cost"].items()}
        c = float(data.get("draft_cost_ratio") or 0.0) if draft_model else 0.0
        prefill = float(data.get("draft_prefill_cost") or 0.0) if draft_model else 0.0
        fixed = float(data.get("draft_prefill_fixed") or 0.0) if draft_model else 0.0
        if draft_model and prefill > 0 and "draft_prefill_fixed" not in data:
            # a profile from before the fixed part was measured: its per-token price is one
            # context-long prefill over its length. Any prefill reads the draft's weights at least
            # once (c), so that much is fixed and the rest per token.
            context = float(data.get("context") or 512)
            fixed, prefill = c, max(prefill - c / context, 0.0)
        quadratic = float(data.get("draft_prefill_quadratic") or 0.0) if draft_model else 0.0
        rows = {int(n): float(d) for n, d in (data.get("draft_rows") or {1: 1.0}).items()} if draft_model else {1: 1.0}
        return CostModel(curve, c, data.get("step_seconds"), prefill, fixed, quadratic, rows)


def fit_prefill(short: tuple[int, float], long: tuple[int, float]) -> tuple[float, float]:
    """(fixed, per token) of an affine prefill cost through two measured (length, cost) points."""
    (n0, t0), (n1, t1) = short, long
    if not 0 < n0 < n1:
        raise SpecdecError(f"a prefill fit needs two lengths 0 < short < long, got {n0} and {n1}")
    per_token = max((t1 - t0) / (n1 - n0), 0.0)
    return max(t0 - per_token * n0, 0.0), per_token


def quadratic_part(fixed: float, per_token: float, longest: tuple[int, float]) -> float:
    """The prefill's part per token squared: how far a long prefill (length, cost) exceeds the affine
    price fitted on short ones, over its length squared (0 where it does not)."""
    n, cost = longest
    if n <= 0:
        raise SpecdecError(f"a prefill length must be positive, got {n}")
    return max((cost - fixed - per_token * n) / (n * n), 0.0)


def load_profile(path: str) -> dict:
    """A `specdec profile` JSON with its verify curve as {int n: float v(n)} (and d(n) where it has one); a clear
    error otherwise."""
    try:
        with open(path) as f:
            data = json.load(f)
        data["verify_cost"] = {int(n): float(v) for n, v in data["verify_cost"].items()}
        for key in ("step_seconds", "context", "draft_cost_ratio", "draft_prefill_cost", "draft_prefill_fixed",
                    "draft_prefill_quadratic"):
            if data.get(key) is not None:
                data[key] = float(data[key])
        if data.get("draft_rows") is not None:
            data["draft_rows"] = {int(n): float(d) for n, d in data["draft_rows"].items()}
        return data
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SpecdecError(f"cannot read a `specdec profile` JSON from {path}: {e}") from None


def expected_tokens(beta: list[float], k: int) -> float:
    """E(k) = 1 + sum_{i<=k} prod_{j<=i} beta_j: tokens one step emits, the recovered/bonus one included."""
    total, reach = 1.0, 1.0
    for i in range(k):
        reach *= beta[i]
        total += reach
    return total


def round_draft_cost(costs: CostModel, c: float, ks: list[int]) -> float:
    """Drafting one round's chains of lengths ks (one a row), in plain steps: draft position j is one
    forward over the rows drafting that far, c d(those rows) (a pooled draft; d(n) = n: each row alone)."""
    return sum(c * costs.d(sum(1 for k in ks if k >= j)) for j in range(1, max(ks, default=0) + 1))


def best_k(beta: list[float], costs: CostModel, k_max: int, batch: int = 1, rho_v: float = 1.0,
           draft_cost: float | None = None, rho_spec: float | None = None, margin: float = 0.0) -> tuple[int, float]:
    """The k in 0..k_max with the highest predicted tokens per unit time, and that rate (per sequence).
    Calibration: rho_v scales a plain step's verify forward and rho_spec (default rho_v) a drafted
    step's; draft_cost replaces c (all in plain-step units). margin: drafting must beat plain by this
    fraction (a prediction at break-even is as likely a loss as a gain, and drafting pays costs the
    model does not see); the rate returned is then the best k's own."""
    rho_spec = rho_v if rho_spec is None else rho_spec
    c = costs.draft_cost if draft_cost is None else draft_cost
    plain = batch / (rho_v * costs.v(batch))
    best, rate = 0, plain * (1 + margin)
    rows = costs.d(batch)  # one draft position for the whole batch, in one row's forwards
    for k in range(1, k_max + 1):
        r = batch * expected_tokens(beta, k) / (rho_spec * costs.v(batch * (k + 1)) + k * c * rows)
        if r > rate * (1 + 1e-9):
            best, rate = k, r
    return best, (rate if best else plain) / batch

