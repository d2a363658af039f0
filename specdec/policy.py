"""Speculation policy: pick the draft length k for each step from measured costs and running acceptance.

Cost model (units: one plain decode step of the target = 1):
- verifying n positions costs v(n) (v(1) = 1), measured once per model (`measure_costs`) or taken
  from a `specdec profile` JSON;
- one draft token costs c (the draft model's step over the target's; about 0 for lookup drafters).

Acceptance: beta_i is the probability that draft position i is accepted given that positions
1..i-1 were, kept per position as an exponential moving average of what each verify step shows
(positions after the first rejection show nothing). A position not yet seen in this request takes
the pooled average over all positions, and a position a step did not reach relaxes toward that
pooled average, so a chain that always passes is tried longer (an estimate that went low once is not
frozen because the policy stopped drafting that far). A chain of k drafts then emits
E(k) = 1 + sum_{i<=k} prod_{j<=i} beta_j tokens per step (the i.i.d. case gives (1 - a^(k+1)) / (1 - a))
for k c + v(k + 1) time. The policy takes the k with the best E(k) / time; k = 0 is plain decoding
(1 token per 1 time).

Calibration: the offline curve times bare forwards at one context length. A real step also pays a
longer context, the draft model's catch-up on accepted tokens, sampling and host work. When the cost
model knows the plain step in seconds (`step_seconds`, t1), the engine reports each step's measured
draft and verify seconds, and the policy keeps two moving averages in t1 units: rho_v, measured over
predicted verify seconds (every step, plain ones included, so plain and drafting steps are scaled
alike), and c_eff, the measured draft seconds per draft token (drafting steps that follow a drafting
step; a probe also pays the catch-up on the plain steps' tokens). A step of k then costs
rho_v v(k + 1) + k c_eff against rho_v for plain, so a drafter dearer than the curve says loses its
steps to plain decoding, and a longer context alone does not. While plain, it probes now and then with a short draft so it can come back when
the text turns predictable; the probe interval doubles after each failed probe (bounded).

Batch awareness: with B sequences in a verify pass the target reads its weights once for B (k + 1)
rows, so plain costs v(B) for B tokens and a chain costs B k c + v(B (k + 1)) for B E(k) tokens;
above a measured critical batch no k pays. A fixed schedule {batch size: k} (vLLM's
num_speculative_tokens_per_batch_size) overrides the model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

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

    def __post_init__(self):
        if not self.verify_cost or 1 not in self.verify_cost:
            raise SpecdecError("a cost model needs v(1) among its verify costs")
        if any(n < 1 or v <= 0 for n, v in self.verify_cost.items()) or self.draft_cost < 0:
            raise SpecdecError(f"costs must be positive: v={self.verify_cost}, c={self.draft_cost}")

    def v(self, n: int) -> float:
        return interpolate(self.verify_cost, n)

    def step_time(self, k: int, batch: int = 1) -> float:
        return batch * k * self.draft_cost + self.v(batch * (k + 1))

    @staticmethod
    def from_profile(data: dict, drafter_kind: str = "draft") -> "CostModel":
        curve = {int(n): float(v) for n, v in data["verify_cost"].items()}
        c = float(data.get("draft_cost_ratio") or 0.0) if drafter_kind == "draft" else 0.0
        return CostModel(curve, c, data.get("step_seconds"))


def expected_tokens(beta: list[float], k: int) -> float:
    """E(k) = 1 + sum_{i<=k} prod_{j<=i} beta_j: tokens one step emits, the recovered/bonus one included."""
    total, reach = 1.0, 1.0
    for i in range(k):
        reach *= beta[i]
        total += reach
    return total


def best_k(beta: list[float], costs: CostModel, k_max: int, batch: int = 1, rho_v: float = 1.0,
           draft_cost: float | None = None) -> tuple[int, float]:
    """The k in 0..k_max with the highest predicted tokens per unit time, and that rate (per sequence).
    Calibration: rho_v scales every verify forward, draft_cost replaces c (both in plain-step units)."""
    c = costs.draft_cost if draft_cost is None else draft_cost
    best, rate = 0, batch / (rho_v * costs.v(batch))
    for k in range(1, k_max + 1):
        r = batch * expected_tokens(beta, k) / (rho_v * costs.v(batch * (k + 1)) + batch * k * c)
        if r > rate * (1 + 1e-9):
            best, rate = k, r
    return best, rate / batch


@dataclass
class PolicyConfig:
    k_max: int = 8
    prior: float = 0.6  # beta_i before anything is seen
    decay: float = 0.3  # EMA weight of the newest observation
    probe_k: int = 2  # draft length of a probe while plain
    probe_every: int = 8  # plain steps before the first probe
    probe_every_max: int = 64  # after repeated failed probes
    relax: float = 0.15  # per step, how far a position the step did not reach moves toward the pooled rate
    calibrate: bool = True  # scale predicted step times by measured / predicted seconds (needs step_seconds)
    schedule: dict[int, int] | None = None  # fixed {min batch size: k}; overrides the model

    def __post_init__(self):
        if self.k_max < 1:
            raise SpecdecError(f"k_max must be >= 1, got {self.k_max}")
        if not 0.0 <= self.prior <= 1.0 or not 0.0 < self.decay <= 1.0:
            raise SpecdecError(f"prior must be in [0, 1] and decay in (0, 1], got {self.prior}, {self.decay}")
        if self.probe_every < 1 or self.probe_every_max < self.probe_every:
            raise SpecdecError("need 1 <= probe_every <= probe_every_max")


def parse_schedule(text: str) -> dict[int, int]:
    """'1:4,4:2,8:0' -> {1: 4, 4: 2, 8: 0}: from batch size 1 use k=4, from 4 use 2, from 8 plain."""
    out = {}
    try:
        for item in text.split(","):
            b, k = item.split(":")
            out[int(b)] = int(k)
    except ValueError:
        raise SpecdecError(f"a k schedule is 'batch:k,batch:k' with integers, e.g. 1:4,4:2,8:0; got {text!r}") from None
    if not out or min(out) < 1 or min(out.values()) < 0:
        raise SpecdecError(f"a k schedule needs batch sizes >= 1 and k >= 0, got {text!r}")
    return out


@dataclass
class AdaptivePolicy:
    """Per request: choose k before each step, learn from each verify outcome."""

    costs: CostModel
    cfg: PolicyConfig = field(default_factory=PolicyConfig)

    def __post_init__(self):
        self.reset()

    def reset(self) -> None:
        self.ema = [self.cfg.prior] * self.cfg.k_max
        self.seen = [False] * self.cfg.k_max
        self.pooled = self.cfg.prior  # EMA over every observation, any position
        self.plain_run = 0  # plain steps since the last drafted step
        self.interval = self.cfg.probe_every
        self.rho_v = 1.0  # measured / predicted seconds of verify forwards (EMA)
        self.draft_cost = self.costs.draft_cost  # c_eff: measured draft seconds per draft token / t1 (EMA)
        self.probed = False  # the last drafting step came right after plain steps

    @property
    def beta(self) -> list[float]:
        return [e if seen else self.pooled for e, seen in zip(self.ema, self.seen)]

    def choose(self, batch: int = 1, k_cap: int | None = None) -> int:
        k_cap = self.cfg.k_max if k_cap is None else min(k_cap, self.cfg.k_max)
        if self.cfg.schedule:
            sizes = [b for b in self.cfg.schedule if b <= batch]
            return min(self.cfg.schedule[max(sizes)] if sizes else 0, k_cap)
        k, _ = best_k(self.beta, self.costs, k_cap, batch, self.rho_v, self.draft_cost)
        if k == 0 and self.plain_run + 1 >= self.interval:
            k = min(self.cfg.probe_k, k_cap)  # a cheap look: has the text turned predictable?
        return k

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        """One verify step's outcome: positions 1..accepted passed, position accepted+1 (if drafted) failed."""
        if num_drafted == 0:
            self.plain_run += 1
            return
        d = self.cfg.decay
        reached = min(num_drafted, num_accepted + 1, self.cfg.k_max)
        for i in range(reached):
            hit = 1.0 if i < num_accepted else 0.0
            if not self.seen[i]:
                self.ema[i], self.seen[i] = self.pooled, True
            self.ema[i] = (1 - d) * self.ema[i] + d * hit
            self.pooled = (1 - d) * self.pooled + d * hit
        for i in range(reached, self.cfg.k_max):  # not reached this step: drift toward the pooled rate
            self.ema[i] += self.cfg.relax * (self.pooled - self.ema[i])
        was_plain = self.plain_run > 0
        self.probed = was_plain
        self.plain_run = 0
        if was_plain:  # that was a probe
            pays = best_k(self.beta, self.costs, self.cfg.k_max, 1, self.rho_v, self.draft_cost)[0] > 0
            self.interval = self.cfg.probe_every if pays else min(2 * self.interval, self.cfg.probe_every_max)


    def observe_time(self, k: int, draft_seconds: float | None, verify_seconds: float, batch: int = 1) -> None:
        """A step's measured draft and verify seconds (this sequence's share of a batched verify);
        draft_seconds None = not measured. Calibrates rho_v and c_eff."""
        t1 = self.costs.step_seconds
        if not self.cfg.calibrate or not t1 or verify_seconds <= 0:
            return
        d = self.cfg.decay
        predicted = t1 * self.costs.v(batch * (k + 1)) / batch
        ratio = min(max(verify_seconds / predicted, 0.25), 4.0)  # one outlier (a GC pause) must not flip it
        self.rho_v = (1 - d) * self.rho_v + d * ratio
        if k > 0 and draft_seconds is not None and not self.probed:
            c = min(max(draft_seconds / (t1 * k), 0.0), 4.0)
            self.draft_cost = (1 - d) * self.draft_cost + d * c


@torch.inference_mode()
def measure_costs(target, draft=None, sizes=(1, 2, 3, 5, 9), context: int = 256, repeats: int = 3) -> CostModel:
    """v(n) for the target and c for a draft model, timed on this machine (a few seconds).

    target/draft: Transformer modules. Each forward runs at `context` cached positions."""
    def step_seconds(model, n: int) -> float:
        cache = model.new_cache(context + max(sizes) + 1)
        device = cache.k.device
        prompt = torch.randint(0, model.config.vocab_size, (1, context), device=device)
        model(prompt, cache, 0, last_only=True)
        cache.advance(context)
        x = torch.randint(0, model.config.vocab_size, (1, n), device=device)
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            sync(device)
            t0 = time.perf_counter()
            model(x, cache, context)
            sync(device)
            times.append(time.perf_counter() - t0)
        return sorted(times[1:])[len(times[1:]) // 2]

    t1 = step_seconds(target, 1)
    curve, floor = {}, 1.0
    for n in sorted(sizes):  # more positions never cost less: timing noise must not make v(n) dip
        floor = curve[n] = 1.0 if n == 1 else max(floor, step_seconds(target, n) / t1)
    c = step_seconds(draft, 1) / t1 if draft is not None else 0.0
    return CostModel(curve, c, t1)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
