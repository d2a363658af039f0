"""Speculation policy: pick the draft length k for each step from measured costs and running acceptance.

Cost model (units: one plain decode step of the target = 1):
- verifying n positions costs v(n) (v(1) = 1), measured once per model (`measure_costs`) or taken
  from a `specdec profile` JSON;
- one draft token costs c (the draft model's step over the target's; about 0 for lookup drafters).

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

Calibration: the offline curve times bare forwards at one context length. A real step also pays a
longer or shorter context, the draft model's catch-up on accepted tokens, sampling and host work.
When the cost model knows the plain step in seconds (`step_seconds`, t1), the engine reports each
step's measured draft and verify seconds, and the policy keeps three moving averages in t1 units:
rho_v, measured over predicted seconds of plain steps; rho_spec, the same for drafted steps (a
multi-position verify: sampled verification's softmax over the vocabulary at every position, for
one, makes it dearer relative to a plain step than the bare forwards say); and c_eff, the measured
draft seconds per draft token (drafting steps that follow a drafting step; a probe also pays the
catch-up on the plain steps' tokens). A step of k then costs rho_spec v(k + 1) + k c_eff against
rho_v for plain, so a drafter dearer than the curve says loses its steps to plain decoding, and a
longer context alone (which slows both alike) does not. A plain step of a plain run that moves
rho_v moves every drafting price (rho_spec, c_eff, the prefill's scale) by the same factor: a host
that slows down slows every kind of step, so a slow spell seen while plain must not make drafting
look cheap. The calibration carries over to the next request. rho_spec is measured only on drafted
steps, so once drafting has stopped (probe_every plain steps in a row) each plain step moves it a
plain_relax share back toward rho_v, the curve's own ratio: a slow spell that made verifies look dear cannot lock drafting (and its probes) out for good.
While plain, it probes now and then with a one-token draft so it can come back when the text turns
predictable; the probe interval doubles after each failed probe (bounded). A request
whose carried estimate says plain probes at its first step: the carried prior is only a guess
about this request's text, and a passing probe costs nothing.

Trees: a drafter that can propose token trees (the draft model with a tree configuration) gives
the policy tree sizes as further actions. A tree of n nodes and depth D emits 1 + sum_{i<=D}
prod_{j<=i} gamma_{n,j} tokens for D c_tree + v(n + 1) time, with gamma_{n,i} the chance its
accepted path reaches depth i once it reached i - 1 (discounted Beta estimates per size and depth,
with an optimistic prior from the chain's estimate, so that an untried size gets tried; a tree's
outcome also feeds the pooled rate, so that the chain gets tried too), and c_tree the
measured draft cost per tree depth. The policy proposes the tree when it beats the best chain and
plain; trees are verified alone, so only at batch 1.

Confidence rule (single-sequence chains of a drafter that knows its confidence: a draft model, a
hybrid's model steps): once choose() says draft, the drafter may go up to k_cap, and before each token
asks the rule from confident_draft() with the top probability p of its distribution there. a(p),
per bin of p, is the chance such a token passes given the chain reached it; n(p) the chance that,
after a passing token of that confidence, the next look passes too (Beta estimates with prior mean
p, kept across requests). With R the chance the chain got this far and r the rate choose()
predicted (for a probe: plain decoding's, with the margin; a confident draft then probes with a
chain, a doubtful one not at all): the token (its draft forward spent) is drafted if R a(p) beats r times the verify time it
adds, and the drafter goes on after it if the further tokens (n(p) each; a draft forward and a
verify position each) add more than r times their time. A chain the rule ended after all its
tokens passed counts a failure at the next position, and one ended before its first token is a
failed look, not a plain step: the position estimates then measure what looking yields.

Admission: a draft model must prefill the prompt before its first proposal (prefill_fixed +
prefill_cost per prompt token, in plain steps: a fixed part, since any prefill reads the draft's
weights and a few rows run the slow small-M GEMMs, and a part per token; scaled by rho_prefill,
the measured over predicted seconds of earlier prefills, which an affine price keeps the same for
short and long prompts). The saving it buys is the predicted saving per token times the tokens still to come, and
how many come is unknown: after a long prompt a RAG answer runs to 20 tokens, a summary to hundreds.
The engine and the server rent before they buy (start_now, a ski rental): it starts the draft
model with the prompt only when the prefill costs at most commit_share (1/4) of the saving predicted
over the expected answer (max_new_tokens, or less: the running mean length of earlier answers,
expected_new); otherwise it decodes plain (a hybrid drafts by lookup) and starts the draft model,
prefilling the prompt and the answer so far, once those plain steps have lost as much as the prefill
costs and the tokens left under max_new_tokens could still win it back. A short answer then never
pays the prefill, a long one pays it at most twice. In the server a draft prefill stalls the whole
batch, so there both terms are taken at the round's batch size. A prefill within a
small learning allowance (the fixed part of a prefill plus 5% of max_new_tokens plain steps: a short
prompt) is admitted at the start
whatever the prediction (only drafting shows whether this text suits the drafter; without it a low
carried prior would never be tested again), backed off like probes: after a request admitted
on it alone whose drafts did not pay, the next 1, 2, 4, ... (at most learn_backoff_max) requests skip
it; one that pays restores it. In a batch of B the prefill stalls all B sequences, so it counts B
times, against the saving at batch B.

The target's confidence (observe_target): a plain step still shows something, the target's top
probability at the token it chose, and where the target is sure a same-family draft tends to
match it. Drafted steps calibrate target_rate(p) per bin of that probability (a looked-at row
passed or not); a plain step's calibrated rate counts as shadow_weight of an observation in the
pooled rate (it fades by decay per drafted step, as real outcomes come) and in the request's
record that moves the carried prior. So a request running plain (unadmitted, backed off, or
after failed probes) starts the drafter or resumes drafting on its own text's evidence, and the
carried prior learns from requests that never drafted (else a few failed allowance requests can
leave code prompts plain from end to end).

Batch awareness: with B sequences in a verify pass the target reads its weights once for B (k + 1)
rows, so plain costs v(B) for B tokens and a chain costs B k c + v(B (k + 1)) for B E(k) tokens;
above a measured critical batch no k pays. A fixed schedule {batch size: k} (vLLM's
num_speculative_tokens_per_batch_size) overrides the model.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from specdec.drafters.base import END, GO_ON, LAST
from specdec.errors import SpecdecError


CONF_EDGES = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 1.0)  # bins of the draft's top probability


def conf_bin(p: float) -> int:
    return min(bisect.bisect_right(CONF_EDGES, p) - 1, len(CONF_EDGES) - 2)


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

    def __post_init__(self):
        if not self.verify_cost or 1 not in self.verify_cost:
            raise SpecdecError("a cost model needs v(1) among its verify costs")
        if (any(n < 1 or v <= 0 for n, v in self.verify_cost.items()) or self.draft_cost < 0
                or self.prefill_cost < 0 or self.prefill_fixed < 0):
            raise SpecdecError(f"costs must be positive: v={self.verify_cost}, c={self.draft_cost}, "
                               f"prefill {self.prefill_fixed} + {self.prefill_cost} per token")

    def v(self, n: int) -> float:
        return interpolate(self.verify_cost, n)

    @property
    def charges_prefill(self) -> bool:
        """Whether the drafter prefills at a cost (a draft model; lookup drafters do not)."""
        return self.prefill_fixed > 0 or self.prefill_cost > 0

    def prefill(self, n: int) -> float:
        """The drafter's prefill of n tokens in plain steps: a fixed part per forward plus a part per
        token. A short prompt's prefill is mostly the fixed part (the weights are read once however
        few the rows), so pricing by the token alone makes it look cheap, and a calibration
        measured on short prompts then overprices long ones, and the reverse."""
        return self.prefill_fixed + self.prefill_cost * n if n > 0 else 0.0

    def step_time(self, k: int, batch: int = 1) -> float:
        return batch * k * self.draft_cost + self.v(batch * (k + 1))

    @staticmethod
    def from_profile(data: dict, drafter_kind: str = "draft") -> "CostModel":
        curve = {int(n): float(v) for n, v in data["verify_cost"].items()}
        draft = drafter_kind == "draft"
        c = float(data.get("draft_cost_ratio") or 0.0) if draft else 0.0
        prefill = float(data.get("draft_prefill_cost") or 0.0) if draft else 0.0
        fixed = float(data.get("draft_prefill_fixed") or 0.0) if draft else 0.0
        if draft and prefill > 0 and "draft_prefill_fixed" not in data:
            # a profile from before the fixed part was measured: its per-token price is one
            # context-long prefill over its length. Any prefill reads the draft's weights at least
            # once (c), so that much is fixed and the rest per token.
            context = float(data.get("context") or 512)
            fixed, prefill = c, max(prefill - c / context, 0.0)
        return CostModel(curve, c, data.get("step_seconds"), prefill, fixed)


def fit_prefill(short: tuple[int, float], long: tuple[int, float]) -> tuple[float, float]:
    """(fixed, per token) of an affine prefill cost through two measured (length, cost) points."""
    (n0, t0), (n1, t1) = short, long
    if not 0 < n0 < n1:
        raise SpecdecError(f"a prefill fit needs two lengths 0 < short < long, got {n0} and {n1}")
    per_token = max((t1 - t0) / (n1 - n0), 0.0)
    return max(t0 - per_token * n0, 0.0), per_token


def load_profile(path: str) -> dict:
    """A `specdec profile` JSON with its verify curve as {int n: float v(n)}; a clear error otherwise."""
    import json
    try:
        with open(path) as f:
            data = json.load(f)
        data["verify_cost"] = {int(n): float(v) for n, v in data["verify_cost"].items()}
        for key in ("step_seconds", "context", "draft_cost_ratio", "draft_prefill_cost", "draft_prefill_fixed"):
            if data.get(key) is not None:
                data[key] = float(data[key])
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
    for k in range(1, k_max + 1):
        r = batch * expected_tokens(beta, k) / (rho_spec * costs.v(batch * (k + 1)) + batch * k * c)
        if r > rate * (1 + 1e-9):
            best, rate = k, r
    return best, (rate if best else plain) / batch


@dataclass
class PolicyConfig:
    k_max: int = 8
    prior: float = 0.6  # acceptance before anything is seen (a policy's first request)
    margin: float = 0.05  # drafting must predict this much more than plain (no drafting at break-even)
    prior_weight: float = 2.0  # w: the pooled rate's prior weight, in observations
    position_weight: float = 6.0  # how many observations a position's prior (pooled rate / previous position) counts as
    plain_relax: float = 0.1  # per plain step, the share of weight every count loses (estimates drift back to the prior)
    decay: float = 0.15  # per observation, the share of weight old observations lose
    memory: float = 0.5  # per request, how far the next request's prior moves to this request's pooled rate
    learn_budget: float = 0.05  # admission: a prefill's part per token allowed with no predicted saving, x max_new_tokens
    commit_share: float = 0.25  # single sequence: start the draft model at once only if its prefill costs at most
    #                            this share of the predicted saving; else when plain steps have lost as much (start_now)
    length_memory: float = 0.5  # per request, how far the expected answer length moves to that request's length
    learn_backoff_max: int = 8  # after allowance requests that did not pay, skip the allowance for up to this many
    probe_k: int = 1  # draft length of a probe while plain
    probe_every: int = 8  # plain steps before the first probe
    probe_every_max: int = 64  # after repeated failed probes
    probe_first: bool = True  # a request whose estimate says plain still drafts its first step as a probe
    relax: float = 0.15  # per step, how far a position the step did not reach moves toward the pooled rate
    calibrate: bool = True  # scale predicted step times by measured / predicted seconds (needs step_seconds)
    calibration_decay: float = 0.3  # EMA weight of the newest step in rho_v and c_eff
    schedule: dict[int, int] | None = None  # fixed {min batch size: k}; overrides the model
    tree_sizes: tuple[int, ...] = ()  # node budgets the drafter can also propose as trees (empty: chains only)
    tree_depth: int = 0  # those trees' depth cap
    confidence: bool = True  # a drafter that knows its confidence drafts while it predicts a gain (confident_draft)
    conf_weight: float = 4.0  # a confidence bin's prior weight, in observations (prior mean: the bin's confidence)
    conf_decay: float = 0.01  # per observation, the share of weight a bin's old observations lose
    target_signal: bool = True  # plain steps predict acceptance from the target's confidence (observe_target)
    shadow_weight: float = 0.5  # a plain token's predicted acceptance counts as this many observations
    shadow_decay: float = 0.05  # per plain step, the share of weight older predicted acceptances lose

    def __post_init__(self):
        if self.k_max < 1:
            raise SpecdecError(f"k_max must be >= 1, got {self.k_max}")
        if not 0.0 <= self.prior <= 1.0 or not 0.0 < self.decay <= 1.0:
            raise SpecdecError(f"prior must be in [0, 1] and decay in (0, 1], got {self.prior}, {self.decay}")
        if self.prior_weight <= 0 or self.position_weight <= 0 or not 0.0 <= self.plain_relax < 1.0:
            raise SpecdecError(f"need prior_weight > 0, position_weight > 0 and plain_relax in [0, 1), got "
                               f"{self.prior_weight}, {self.position_weight}, {self.plain_relax}")
        if not 0.0 <= self.memory <= 1.0 or self.learn_budget < 0 or self.learn_backoff_max < 0:
            raise SpecdecError(f"need memory in [0, 1], learn_budget >= 0 and learn_backoff_max >= 0, got "
                               f"{self.memory}, {self.learn_budget}, {self.learn_backoff_max}")
        if not 0.0 <= self.commit_share <= 1.0:
            raise SpecdecError(f"commit_share must be in [0, 1], got {self.commit_share}")
        if not 0.0 < self.length_memory <= 1.0:
            raise SpecdecError(f"length_memory must be in (0, 1], got {self.length_memory}")
        if self.probe_every < 1 or self.probe_every_max < self.probe_every:
            raise SpecdecError("need 1 <= probe_every <= probe_every_max")
        if not 0.0 <= self.margin < 1.0:
            raise SpecdecError(f"margin must be in [0, 1), got {self.margin}")
        if self.shadow_weight < 0 or not 0.0 < self.shadow_decay <= 1.0:
            raise SpecdecError(f"need shadow_weight >= 0 and shadow_decay in (0, 1], got {self.shadow_weight}, "
                               f"{self.shadow_decay}")
        if self.conf_weight <= 0 or not 0.0 < self.conf_decay <= 1.0:
            raise SpecdecError(f"need conf_weight > 0 and conf_decay in (0, 1], got {self.conf_weight}, "
                               f"{self.conf_decay}")
        if self.tree_sizes and (self.tree_depth < 1 or min(self.tree_sizes) < 2):
            raise SpecdecError(f"tree sizes need at least 2 nodes and a depth >= 1, got {self.tree_sizes}, "
                               f"depth {self.tree_depth}")


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
        self.prior = self.cfg.prior  # the pooled rate's prior; moves toward each request's outcome
        self.rho_v = 1.0  # measured / predicted seconds of plain steps' forwards (EMA; kept across requests)
        self.rho_spec = 1.0  # the same for drafted steps' verify forwards (EMA; kept across requests)
        self.draft_cost = self.costs.draft_cost  # c_eff: measured draft seconds per draft token / t1 (EMA)
        # the last 3 measurements of each (seeded with the starting values): the EMAs take their median,
        # so one stalled step (a verify that runs 4x slow) does not turn drafting off
        self.recent = {"rho_v": [1.0, 1.0], "rho_spec": [1.0, 1.0], "draft_cost": [self.draft_cost] * 2}
        self.hits = [0.0] * self.cfg.k_max  # discounted accepted observations per position
        self.trials = [0.0] * self.cfg.k_max  # discounted observations per position
        self.pool_hits = self.pool_trials = 0.0  # the same over all positions
        self.request_hits = self.request_trials = 0.0  # this request's undiscounted totals (for the next prior)
        self.request_shadow_hits = self.request_shadow_trials = 0.0
        self.learning = False  # this request was admitted on the learning allowance alone
        self.learn_backoff = self.learn_skip = 0  # requests the allowance skips after one that did not pay
        # trees: measured draft seconds per tree depth / t1 (EMA), per tree size
        self.tree_cost = {n: self.costs.draft_cost for n in self.cfg.tree_sizes}
        # confidence calibration: per bin of the draft's top probability, discounted counts of whether
        # a drafted token there passed (given the chain reached it); kept across requests (it describes
        # the draft/target pair more than the text)
        self.conf_hits = [0.0] * (len(CONF_EDGES) - 1)
        self.conf_trials = [0.0] * (len(CONF_EDGES) - 1)
        # and, per bin of a passing token, whether the look at the next position passed (text the draft
        # is sure of tends to go on being easy: a streak)
        self.next_hits = [0.0] * (len(CONF_EDGES) - 1)
        self.next_trials = [0.0] * (len(CONF_EDGES) - 1)
        # per bin of the target's top probability at a looked-at position, whether the look passed
        # (kept across requests): what a plain step's confidence predicts (observe_target)
        self.target_hits = [0.0] * (len(CONF_EDGES) - 1)
        self.target_trials = [0.0] * (len(CONF_EDGES) - 1)
        self.last_looked = 0  # draft forwards the last step ran (drafted tokens + a look that stopped)
        self.expected_new: float | None = None  # new tokens per request (EMA over requests; None: none seen)
        self.request_tokens = 0  # tokens this request's steps emitted
        self.rho_prefill = 1.0  # measured / predicted seconds of the drafter's prefill (EMA over requests)
        self.reset()

    def reset(self) -> None:
        """A new request: this request's acceptance moves the prior and its length the expected
        answer length, then the counts start afresh."""
        if self.request_tokens > 0:  # (+ 1: the prefill's token)
            n = self.request_tokens + 1
            e = self.expected_new
            self.expected_new = float(n) if e is None else e + self.cfg.length_memory * (n - e)
        self.request_tokens = 0
        ws = self.cfg.shadow_weight
        if self.request_trials > 0 or self.request_shadow_trials > 0:
            # this request's whole record (plain steps relax the running counts), its plain steps'
            # predicted acceptance included: a request that ran plain still tells the next one
            w = self.cfg.prior_weight
            rate = ((self.request_hits + ws * self.request_shadow_hits + w * self.prior)
                    / (self.request_trials + ws * self.request_shadow_trials + w))
            self.prior += self.cfg.memory * (rate - self.prior)
        if self.learning:  # a request admitted only to learn: did its drafts turn out to pay?
            seen = self.request_hits / self.request_trials if self.request_trials else 0.0
            pays = self._best_k([seen] * self.cfg.k_max, self.cfg.k_max)[0] > 0
            self.learn_backoff = 0 if pays else min(2 * self.learn_backoff or 1, self.cfg.learn_backoff_max)
            self.learn_skip = self.learn_backoff
        self.learning = False
        self.request_hits = self.request_trials = 0.0
        self.shadow_hits = self.shadow_trials = 0.0  # plain steps' predicted acceptance (discounted)
        self.request_shadow_hits = self.request_shadow_trials = 0.0  # this request's, undiscounted
        self.hits = [0.0] * self.cfg.k_max
        self.trials = [0.0] * self.cfg.k_max
        self.pool_hits = self.pool_trials = 0.0
        depth = self.cfg.tree_depth
        self.tree_hits = {n: [0.0] * depth for n in self.cfg.tree_sizes}  # per size, per depth
        self.tree_trials = {n: [0.0] * depth for n in self.cfg.tree_sizes}
        self.plain_run = 0  # plain steps since the last drafted step
        self.interval = self.cfg.probe_every
        self.probed = False  # the last drafting step came right after plain steps
        self.opening = True  # no step of this request has run yet
        self.opening_probe = False  # the first step drafts as a probe although the estimate says plain
        self.rate = 0.0  # the predicted tokens per unit time of the last choice that drafted by estimate
        self.step_conf: list[float] = []  # this step's drafted tokens' confidences (under the rule)
        self.step_stopped = False  # this step's chain was ended by the confidence rule
        self.last_admission: dict | None = None  # admit()'s terms and word for this request (for the stats)

    def _best_k(self, beta: list[float], k_max: int, batch: int = 1) -> tuple[int, float]:
        """best_k under this policy's calibration (rho_v, rho_spec, c_eff) and margin."""
        return best_k(beta, self.costs, k_max, batch, self.rho_v, self.draft_cost, self.rho_spec, self.cfg.margin)

    @property
    def wants_target_confidence(self) -> bool:
        """Whether the engine should report the target's top probability per verified row."""
        return self.cfg.target_signal and not self.cfg.schedule

    @property
    def pooled(self) -> float:
        """This request's rate: its drafted steps' outcomes, its plain steps' predicted acceptance
        (shadow_weight each) and the carried prior."""
        w, ws = self.cfg.prior_weight, self.cfg.shadow_weight
        return ((self.pool_hits + ws * self.shadow_hits + w * self.prior)
                / (self.pool_trials + ws * self.shadow_trials + w))

    @property
    def beta(self) -> list[float]:
        """Per-position estimates. Position i's prior is the pooled rate, or position i-1's estimate
        where that is higher: a chain accepted to its end says little about the next position by
        count, but acceptance given the chain got that far rarely drops with depth, and the deeper
        positions are only observed once the policy drafts that far."""
        w, pooled, out = self.cfg.position_weight, self.pooled, []
        for h, n in zip(self.hits, self.trials):
            prior = max(pooled, out[-1]) if out else pooled
            out.append((h + w * prior) / (n + w))
        return out

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
        for i, (h, t) in enumerate(zip(self.tree_hits[n], self.tree_trials[n])):
            b = chain[i] if i < len(chain) else self.pooled
            prior = max(1.0 - (1.0 - b) ** m, below[i] if below else 0.0, out[-1] if out else 0.0)
            out.append((h + w * prior) / (t + w))
        return out

    def tree_rate(self, n: int, depth: int) -> float:
        """Predicted tokens per unit time of a tree of n nodes and the given depth (alone, batch 1)."""
        seconds = self.rho_spec * self.costs.v(n + 1) + depth * self.tree_cost[n]
        return expected_tokens(self.tree_beta(n), depth) / seconds

    def choose_action(self, batch: int = 1, k_cap: int | None = None,
                      nodes_cap: int | None = None) -> tuple[int, int | None]:
        """(k, None): a chain of k (0: plain), as choose(); or (depth, n): a tree of at most n nodes,
        where a tree size predicts more tokens per time than the best chain and plain. Trees are
        verified alone, so they are weighed only at batch 1."""
        k_cap = self.cfg.k_max if k_cap is None else min(k_cap, self.cfg.k_max)
        sizes = [n for n in self.cfg.tree_sizes if nodes_cap is None or n <= nodes_cap]
        if batch == 1 and sizes and k_cap > 0 and not self.cfg.schedule:
            depth = min(self.cfg.tree_depth, k_cap)
            k, chain_rate = self._best_k(self.beta, k_cap)
            bar = chain_rate if k else chain_rate * (1 + self.cfg.margin)  # a tree must clear plain's margin too
            rate, n = max((self.tree_rate(n, depth), n) for n in sizes)
            if rate > bar * (1 + 1e-9):
                self.opening_probe = False
                return depth, n
        return self.choose(batch, k_cap), None

    def observe_tree(self, n: int, depth: int, num_accepted: int) -> None:
        """A tree step's outcome: a tree of (at most) n nodes and this depth; its accepted path's length."""
        # The pooled rate (the chain's prior) learns from trees too: a tree's accepted path is at least
        # what a chain would have passed, so an optimistic chain estimate gets the chain tried, and
        # a policy that has only seen trees does not keep the chain at its starting prior forever.
        self._count(self.tree_hits[n], self.tree_trials[n], depth, num_accepted)
        self.request_tokens += num_accepted + 1
        self.opening = self.opening_probe = self.probed = False
        self.plain_run = 0

    def _count(self, hits: list[float], trials: list[float], drafted: int, num_accepted: int) -> None:
        """One step's outcome into discounted per-position counts (positions 1..accepted passed, the
        next one, if drafted, failed; unreached positions drift toward the pooled rate) and into
        the pooled counts."""
        keep = 1.0 - self.cfg.decay
        reached = min(drafted, num_accepted + 1, len(hits))
        for i in range(len(hits)):
            if i < reached:
                hits[i] = keep * hits[i] + (1.0 if i < num_accepted else 0.0)
                trials[i] = keep * trials[i] + 1.0
            else:
                hits[i] *= 1.0 - self.cfg.relax
                trials[i] *= 1.0 - self.cfg.relax
        self.pool_hits = keep * self.pool_hits + min(num_accepted, reached)
        self.pool_trials = keep * self.pool_trials + reached
        self.request_hits += min(num_accepted, reached)
        self.request_trials += reached

    def assume(self, beta: list[float], weight: float = 1000.0) -> None:
        """Set the per-position estimates as if `weight` observations had shown `beta` (tests, warm starts)."""
        for i, b in enumerate(beta[: self.cfg.k_max]):
            self.hits[i], self.trials[i] = b * weight, weight

    def _prefill_terms(self, prefill_len: int, max_new_tokens: int, batch: int) -> tuple[float, float, float]:
        """(the drafter's prefill of prefill_len tokens, the saving predicted per new token, the expected
        answer length), times in plain steps: the prefill priced by the profile and scaled by the
        measured prefills (counted `batch` times: it stalls every running sequence), the saving at
        the best k's predicted rate (none above the critical batch), the length min(max_new_tokens,
        the running mean length of earlier answers)."""
        batch = max(batch, 1)
        cost = self.costs.prefill(prefill_len) * self.rho_prefill * batch
        _, rate = self._best_k(self.beta, self.cfg.k_max, batch)
        plain = 1.0 / (self.rho_v * self.costs.v(batch))  # per-sequence plain rate at this batch
        per_token = 1.0 / plain - 1.0 / rate if rate > plain else 0.0
        horizon = max_new_tokens if self.expected_new is None else min(max_new_tokens, self.expected_new)
        return cost, per_token, horizon

    def admit(self, prompt_len: int, max_new_tokens: int, batch: int = 1, share: float = 1.0) -> bool:
        """Whether this request should use the drafter at all, decided once at its start (callers
        that cannot start it later; the engine and the server ask start_now): its prefill of the prompt must cost at
        most `share` of the saving predicted over the expected answer, or fit the learning allowance.
        A 900-token RAG prompt whose answers run to 20 tokens cannot win its draft prefill back,
        whatever max_new_tokens allows.

        In a batch of B running sequences the draft's prefill stalls all of them, so it counts B
        times, against the saving predicted at that batch size (none above the critical batch)."""
        if not self.costs.charges_prefill or self.cfg.schedule:
            return True
        cost, per_token, horizon = self._prefill_terms(prompt_len, max_new_tokens, batch)
        # what the decision rests on, for the request's stats (a refusal can then be checked)
        self.last_admission = {"prefill_cost": round(cost, 3), "saving_per_token": round(per_token, 4),
                               "horizon": round(horizon, 1), "share": share, "prior": round(self.prior, 3),
                               "rho_prefill": round(self.rho_prefill, 3), "rho_v": round(self.rho_v, 3),
                               "rho_spec": round(self.rho_spec, 3), "draft_cost": round(self.draft_cost, 3),
                               "learn_skip": self.learn_skip}
        word = self._admit(cost, per_token, horizon, max_new_tokens, batch, share)
        self.last_admission["admitted"] = word
        return word

    def _admit(self, cost: float, per_token: float, horizon: float, max_new_tokens: int, batch: int,
               share: float) -> bool:
        if cost <= share * per_token * horizon:
            return True
        # the allowance bounds the prefill's part per token; its fixed part is the price of any look
        # (priced as the calibration says), however short the prompt
        allowance = self.costs.prefill_fixed * self.rho_prefill + self.cfg.learn_budget * max_new_tokens
        if batch > 1 or cost > allowance:
            return False
        # The learning allowance, backed off like probes: after an allowance request whose drafts did
        # not pay, the next 1, 2, 4, ... requests skip it. Each still-admitted one can bring drafting
        # back (a refused request shows nothing, so the allowance is never switched off for good).
        if self.learn_skip > 0:
            self.learn_skip -= 1
            return False
        self.learning = True
        return True

    def start_now(self, prefill_len: int, generated: int, max_new_tokens: int, batch: int = 1) -> bool:
        """Whether the drafter should prefill the text so far (prefill_len of its tokens) and start
        drafting now. Asked at the request's start (generated = 0) and, until it says yes, before
        each step, which runs plain meanwhile. In a batch of B decoding sequences (the server) the
        prefill stalls all of them and the saving is the one predicted at that batch size, as in
        admit. A ski rental:
        - at the start, only when the prefill costs at most commit_share of the saving predicted over
          the expected answer, or fits the learning allowance (as admit: a short prompt's prefill is
          cheap, and only drafting shows whether this text suits the drafter): a short answer then
          loses little, a long one wins almost all;
        - later, once the plain steps so far have lost as much as the prefill costs (generated times
          the saving per token), and the tokens left under max_new_tokens could still win it back.
        An answer that ends before that never pays for the prefill; one that runs on pays at most the
        prefill twice. The answer length after a long prompt (RAG: 20 tokens; a summary: hundreds)
        cannot be told from the prompt, and the running mean of earlier answers mixes the two."""
        if not self.costs.charges_prefill or self.cfg.schedule:
            return True
        if generated == 0:
            return self.admit(prefill_len, max_new_tokens, batch, share=self.cfg.commit_share)
        cost, per_token, _ = self._prefill_terms(prefill_len, max_new_tokens, batch)
        left = max_new_tokens - generated
        return per_token > 0 and cost <= per_token * min(generated, left)

    def observe_prefill(self, prompt_len: int, seconds: float) -> None:
        """The drafter's measured prefill of a prompt: calibrates the prefill cost admission uses."""
        t1 = self.costs.step_seconds
        if not self.cfg.calibrate or not t1 or not self.costs.charges_prefill or prompt_len < 1 or seconds <= 0:
            return
        ratio = min(max(seconds / (t1 * self.costs.prefill(prompt_len)), 0.25), 4.0)
        d = self.cfg.calibration_decay
        self.rho_prefill = (1 - d) * self.rho_prefill + d * ratio

    def choose(self, batch: int = 1, k_cap: int | None = None) -> int:
        k_cap = self.cfg.k_max if k_cap is None else min(k_cap, self.cfg.k_max)
        if self.cfg.schedule:
            sizes = [b for b in self.cfg.schedule if b <= batch]
            return min(self.cfg.schedule[max(sizes)] if sizes else 0, k_cap)
        k, self.rate = self._best_k(self.beta, k_cap, batch)
        # A request starts with a probe when the carried prior says plain (this request's text may
        # suit the drafter better than the last one's), then plain steps probe now and then.
        # Probes only where plain is the estimate's doing: if even a good drafter (beta 0.9) cannot
        # pay at this batch size and draft cost, no probe can show otherwise.
        if k > 0 or not (self.opening and self.cfg.probe_first or self.plain_run + 1 >= self.interval):
            return k
        if self._best_k([0.9] * k_cap, k_cap, batch)[0] == 0:
            return 0
        self.opening_probe = self.opening and self.cfg.probe_first
        # a cheap look: has the text turned predictable? Under the confidence rule the look drafts
        # while each token's calibrated confidence predicts more than plain decoding's rate (with the
        # margin): a confident draft probes with a chain (its verify shows more), a doubtful one drafts
        # nothing (a failed look); without the rule, probe_k tokens
        self.rate = (1 + self.cfg.margin) / (self.rho_v * self.costs.v(batch))  # per sequence
        return min(self.cfg.probe_k, k_cap)

    def confidence_rate(self, p: float) -> float:
        """The chance a drafted token whose draft probability was p passes, given the chain reached it:
        a Beta estimate per confidence bin, whose prior mean is the bin's confidence (a calibrated draft)."""
        return self._bin_rate(self.conf_hits, self.conf_trials, p)

    def next_rate(self, p: float) -> float:
        """The chance that, after a passing token of draft probability p, looking at the next position
        yields a passing token (a Beta estimate per bin; prior mean: the bin's confidence)."""
        return self._bin_rate(self.next_hits, self.next_trials, p)

    def target_rate(self, p: float) -> float:
        """The chance a look at a position where the target's top probability is p passes (a Beta
        estimate per bin, prior mean the bin's confidence), learned from drafted steps."""
        return self._bin_rate(self.target_hits, self.target_trials, p)

    def observe_target(self, confidence, num_drafted: int, num_accepted: int) -> None:
        """The target's top probability at each verified row of a step (rows 0..num_drafted); call
        before observe(). A step that looked: its looked-at rows calibrate target_rate (a row passed
        if its token was accepted), and the plain steps' predictions fade as real outcomes come. A
        plain step: its row's calibrated rate counts as a predicted acceptance in the pooled rate.

        This is the per-request signal a plain request lacks: the carried prior says how the last
        requests drafted, the target's confidence on this one's own tokens how this one would (code
        the target is sure of: high; open prose: low). A request that runs plain (not admitted, or
        after failed probes) can so start or resume drafting from what its text shows, and a
        few poor requests cannot lock drafting out of the next, different ones."""
        if not self.cfg.target_signal or not confidence:
            return
        looked = self._looked(num_drafted, num_accepted)
        if looked == 0:
            a, keep = self.target_rate(confidence[0]), 1.0 - self.cfg.shadow_decay
            self.shadow_hits = keep * self.shadow_hits + a
            self.shadow_trials = keep * self.shadow_trials + 1.0
            self.request_shadow_hits += a
            self.request_shadow_trials += 1.0
            return
        for j, p in enumerate(confidence[:min(looked, num_accepted + 1)]):
            self._count_bin(self.target_hits, self.target_trials, p, j < num_accepted)
        keep = 1.0 - self.cfg.decay
        self.shadow_hits *= keep
        self.shadow_trials *= keep

    def _looked(self, num_drafted: int, num_accepted: int) -> int:
        """Positions this step looked at: its drafted tokens, and one more where the confidence rule
        ended a chain whose tokens all passed (a failed look)."""
        return num_drafted + int(self.step_stopped and num_accepted == num_drafted)

    def _count_bin(self, hits: list[float], trials: list[float], p: float, passed: bool) -> None:
        """One outcome into the confidence bin of p (discounted by conf_decay)."""
        b, keep = conf_bin(p), 1.0 - self.cfg.conf_decay
        hits[b] = keep * hits[b] + (1.0 if passed else 0.0)
        trials[b] = keep * trials[b] + 1.0

    def _bin_rate(self, hits: list[float], trials: list[float], p: float) -> float:
        b = conf_bin(p)
        prior = 0.5 * (CONF_EDGES[b] + CONF_EDGES[b + 1])
        w = self.cfg.conf_weight
        return (hits[b] + w * prior) / (trials[b] + w)

    def confident_draft(self, k: int, k_cap: int) -> tuple[int, Callable[[int, float], int] | None]:
        """After choose() returned k for a chain: (the most tokens to draft, the rule) for a drafter that
        knows its confidence (DraftState.stop). Where choose() drafts (by estimate, or a probe: then
        against plain decoding's rate) and the rule is on, the drafter may go up to k_cap, the rule
        deciding each token; else (k, None)."""
        if not self.cfg.confidence or k == 0 or self.rate <= 0 or self.cfg.schedule:
            return k, None
        self.step_conf, self.step_stopped, reach = [], False, [1.0]
        rate, c = self.rate, self.draft_cost

        def V(n: int) -> float:  # verify time of a step with n drafted tokens
            return self.rho_v * self.costs.v(1) if n == 0 else self.rho_spec * self.costs.v(n + 1)

        def stop(i: int, p: float) -> int:
            """Token i + 1, of draft probability p (its draft forward is spent): worth drafting if the
            tokens it adds beat the predicted rate x the verify time it adds; worth going on after it
            if the further tokens (each passing at next_rate(p), each a draft forward and a verify
            position) add more than rate x their time."""
            a, b = self.confidence_rate(p), self.next_rate(p)
            r = reach[0] * a
            here = r - rate * (V(i + 1) - V(i))
            value = after = 0.0
            for j in range(i + 1, k_cap):
                r *= b
                value += r - rate * (c + V(j + 1) - V(j))
                after = max(after, value)
            if here + after <= 0:
                self.step_stopped = True
                return END
            reach[0] *= a
            self.step_conf.append(p)
            return GO_ON if after > 0 else LAST

        return max(k, k_cap), stop

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        """One verify step's outcome: positions 1..accepted passed, position accepted+1 (if drafted) failed.

        Under the confidence rule the action is "look, and draft while confident": a chain the rule
        ended after all its tokens passed counts a failure at the next position (the look found
        nothing worth drafting), so the estimates measure what looking yields, and a step that stopped
        before its first token is a failed look, not a plain step. The drafted tokens' outcomes also
        calibrate the confidence bins."""
        opening_probe, self.opening, self.opening_probe = self.opening_probe, False, False
        self.request_tokens += num_accepted + 1
        looked = self._looked(num_drafted, num_accepted)
        for j, p in enumerate(self.step_conf[:num_drafted][:num_accepted + 1]):
            self._count_bin(self.conf_hits, self.conf_trials, p, j < num_accepted)
            if j < num_accepted and j + 1 < looked:  # it passed, and the next position was looked at
                self._count_bin(self.next_hits, self.next_trials, p, j + 1 < num_accepted)
        self.step_conf, self.step_stopped, self.last_looked = [], False, looked
        num_drafted = looked  # a failed look at position num_drafted + 1 (count it as drafted, not passed)
        if num_drafted == 0:
            self.plain_run += 1
            if self.cfg.plain_relax > 0:  # slower after failed probes (a longer probe interval)
                keep = 1.0 - self.cfg.plain_relax * self.cfg.probe_every / self.interval
                self.hits = [keep * h for h in self.hits]
                self.trials = [keep * n for n in self.trials]
                self.pool_hits *= keep
                self.pool_trials *= keep
            return
        self._count(self.hits, self.trials, num_drafted, num_accepted)
        was_plain = self.plain_run > 0
        self.probed = was_plain
        self.plain_run = 0
        if was_plain or opening_probe:  # that was a probe
            pays = self._best_k(self.beta, self.cfg.k_max)[0] > 0
            self.interval = self.cfg.probe_every if pays else min(2 * self.interval, self.cfg.probe_every_max)

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
                     width: int | None = None, nodes: int | None = None) -> None:
        """A step's measured draft and verify seconds (this sequence's share of a batched verify, whose
        rows were padded to `width` positions; default k + 1); draft_seconds None = not measured.
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
            before = self.rho_v
            self.rho_v = (1 - d) * self.rho_v + d * self._median3("rho_v", ratio)
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
        elif max(k, self.last_looked) > 0 and draft_seconds is not None and not self.probed:
            c = min(max(draft_seconds / (t1 * max(k, self.last_looked)), 0.0), 4.0)  # per draft forward
            self.draft_cost = (1 - d) * self.draft_cost + d * self._median3("draft_cost", c)


@torch.inference_mode()
def measure_costs(target, draft=None, sizes=(1, 2, 3, 5, 9), context: int = 256, repeats: int = 3) -> CostModel:
    """v(n) for the target, and c and the prefill cost per prompt token for a draft model, timed on
    this machine (a few seconds).

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
    if draft is None:
        return CostModel(curve, 0.0, t1)
    from specdec.bench.profile import forward_seconds
    c = step_seconds(draft, 1) / t1
    short = max(context // 8, 1)  # the prefill's price: fixed + per token, through two prompt lengths
    fixed, per_token = fit_prefill(*((n, forward_seconds(draft, n, 0, repeats, last_only=True) / t1)
                                     for n in (short, context)))
    return CostModel(curve, c, t1, per_token, fixed)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
