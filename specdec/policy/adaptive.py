"""AdaptivePolicy: per request, choose the step's action before each step and learn from each
verify outcome. Its parts live beside it: costs.py (v(n), c, the prefill's price), estimates.py
(acceptance), confidence.py (the confidence rule, the target's confidence), calibration.py
(measured seconds), admission.py (the drafter's prefill), trees.py (token trees).

While plain, it probes now and then with a one-token draft so it can come back when the text turns
predictable; the probe interval doubles after each failed probe (bounded). A request
whose carried estimate says plain probes at its first step: the carried prior is only a guess
about this request's text, and a passing probe costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.policy.admission import Admission
from specdec.policy.calibration import Calibration
from specdec.policy.confidence import ConfidenceRule
from specdec.policy.config import PolicyConfig
from specdec.policy.costs import CostModel, best_k, expected_tokens, round_draft_cost
from specdec.policy.estimates import Acceptance
from specdec.policy.face import Action, Ask, Outcome
from specdec.policy.trees import Trees


@dataclass
class AdaptivePolicy(Acceptance, ConfidenceRule, Calibration, Admission, Trees):
    """Per request: choose k before each step, learn from each verify outcome."""

    costs: CostModel
    cfg: PolicyConfig = field(default_factory=PolicyConfig)
    # the steps a drafter drafts by prompt lookup while its model waits to start are this other
    # policy's (its own acceptance, no draft cost; `lookup_while_waiting`); None: they are this one's
    waiting: "AdaptivePolicy | None" = None

    def __post_init__(self):
        self.prior = self.cfg.prior  # the pooled rate's prior; moves toward each request's outcome
        self._start_calibration()
        self._start_confidence()
        self._start_admission()
        self._reset_acceptance()
        self.reset()

    def reset(self) -> None:
        """A new request: this request's acceptance moves the prior and its length the expected
        answer length, then the counts start afresh."""
        if self.waiting is not None:
            self.waiting.reset()
        self._carry_prior()
        self._end_admission()
        self._reset_acceptance()
        self._reset_trees()
        self._reset_confidence()
        self.plain_run = 0  # plain steps since the last drafted step
        self.interval = self.cfg.probe_every
        self.probed = False  # the last drafting step came right after plain steps
        self.drafted = False  # a step of this request has drafted
        self.first_draft = False  # the last drafting step was the request's first: it caught up on the text
        self.opening = True  # no step of this request has run yet
        self.opening_probe = False  # the first step drafts as a probe although the estimate says plain
        self.rate = 0.0  # the predicted tokens per unit time of the last choice that drafted by estimate

    def fresh(self) -> "AdaptivePolicy":
        """A new policy of the same costs and settings (another slot's), its waiting one too."""
        return AdaptivePolicy(self.costs, self.cfg, self.waiting.fresh() if self.waiting is not None else None)

    @staticmethod
    def lookup_while_waiting(costs: CostModel, k_max: int) -> "AdaptivePolicy":
        """The policy of a drafter's prompt lookup while its model waits for its prefill to pay: the
        same verify costs, drafts free (as the n-gram drafter's), no confidence rule (lookup has none)."""
        return AdaptivePolicy(CostModel(dict(costs.verify_cost), step_seconds=costs.step_seconds),
                              PolicyConfig(k_max=k_max, confidence=False))

    def _best_k(self, beta: list[float], k_max: int, batch: int = 1) -> tuple[int, float]:
        """best_k under this policy's calibration (rho_v, rho_spec, c_eff) and margin."""
        return best_k(beta, self.costs, k_max, batch, self.rho_v, self.draft_cost, self.rho_spec, self.cfg.margin)

    @property
    def wants_target_confidence(self) -> bool:
        """Whether the engine should report the target's top probability per verified row."""
        return self.cfg.target_signal and not self.cfg.schedule

    def plan(self, ask: Ask) -> Action:
        """The engine's question before a step: a tree (where the drafter drafts trees and a tree size
        pays best), a chain of k, or plain; a chain under the confidence rule where the drafter knows
        its confidence."""
        if ask.tree_nodes is not None:
            k, nodes = self.choose_action(ask.batch, ask.k_cap, ask.tree_nodes)
        else:
            k, nodes = self.choose(ask.batch, ask.k_cap), None
        if nodes is None and ask.knows_confidence:
            k_stop, stop = self.confident_draft(k, ask.k_cap, ask.batch)
            return Action(k, None, False, stop, k_stop)
        return Action(k, nodes, nodes is not None)

    def choose_action(self, batch: int = 1, k_cap: int | None = None,
                      nodes_cap: int | None = None) -> tuple[int, int | None]:
        """(k, None): a chain of k (0: plain), as choose(); or (depth, n): a tree of at most n nodes,
        where a tree size predicts more tokens per time than the best chain and plain. Trees are
        verified alone, so they are weighed only at batch 1."""
        k_cap = self.cfg.k_max if k_cap is None else min(k_cap, self.cfg.k_max)
        tree = self._best_tree(k_cap, nodes_cap) if batch == 1 else None
        if tree is not None:
            self.opening_probe = False
            return tree
        return self.choose(batch, k_cap), None

    def choose(self, batch: int = 1, k_cap: int | None = None) -> int:
        """The step's draft length (0: plain): the best k by estimate, a probe now and then while
        plain, or a fixed schedule's k for this batch size."""
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

    def observe(self, outcome: Outcome | int, num_accepted: int | None = None) -> None:
        """One verify step's outcome: an Outcome (the whole step: its shape, the target's confidence
        and its measured seconds), or observe(num_drafted, num_accepted), a chain's acceptance alone."""
        if not isinstance(outcome, Outcome):
            self._observe_chain(outcome, num_accepted)
            return
        o = outcome
        self.request_tokens += o.free_accepted
        if o.nodes is not None:
            self.observe_tree(o.nodes, o.num_drafted, o.num_accepted)
        else:
            if o.confidence:  # before the chain's outcome: it reads this step's confidence rule
                self.observe_target(o.confidence, o.num_drafted, o.num_accepted)
            self._observe_chain(o.num_drafted, o.num_accepted)
        if o.verify_seconds is not None:
            forwards = o.num_drafted if o.forwards is None else o.forwards
            self.observe_time(forwards, o.draft_seconds, o.verify_seconds, o.batch, o.width, o.nodes, o.pooled)

    def _observe_chain(self, num_drafted: int, num_accepted: int) -> None:
        """One verify step's outcome: positions 1..accepted passed, position accepted+1 (if drafted) failed.

        Under the confidence rule the action is "look, and draft while confident": a chain the rule
        ended after all its tokens passed counts a failure at the next position (the look found
        nothing worth drafting), so the estimates measure what looking yields, and a step that stopped
        before its first token is a failed look, not a plain step. The drafted tokens' outcomes also
        calibrate the confidence bins."""
        opening_probe, self.opening, self.opening_probe = self.opening_probe, False, False
        self.request_tokens += num_accepted + 1
        looked = self._looked(num_drafted, num_accepted)
        self._count_confidence(num_drafted, num_accepted, looked)
        self.step_conf, self.step_stopped, self.last_looked = [], False, looked
        num_drafted = looked  # a failed look at position num_drafted + 1 (count it as drafted, not passed)
        if num_drafted == 0:
            self.plain_run += 1
            if self.cfg.plain_relax > 0:  # slower after failed probes (a longer probe interval)
                self._fade_positions(1.0 - self.cfg.plain_relax * self.cfg.probe_every / self.interval)
            return
        self._count(self.positions, num_drafted, num_accepted)
        was_plain = self.plain_run > 0
        self.probed = was_plain
        self.first_draft, self.drafted = not self.drafted, True
        self.plain_run = 0
        if was_plain or opening_probe:  # that was a probe
            pays = self._best_k(self.beta, self.cfg.k_max)[0] > 0
            self.interval = self.cfg.probe_every if pays else min(2 * self.interval, self.cfg.probe_every_max)


def round_width(chosen: list[tuple["AdaptivePolicy | None", int]]) -> int:
    """Positions per row for one batched verify: every row pads to the widest, so a single row
    drafting k makes all B rows cost k + 1. chosen: (the row's adaptive policy or None, its k).

    With adaptive policies on every row, the width W is chosen for the whole round: the one with
    the most expected tokens, sum_b E_b(min(k_b, W - 1)), per predicted time, v(B W) plus the rows'
    draft costs (draft position j costs c d(the rows drafting that far): one pooled forward, or each
    row's own; rows planned by policies of different costs, a draft model's and a waiting lookup's,
    are priced apart, each group at its own c and d(n)); each row then drafts at most W - 1. A lone probe in a large batch no longer makes
    every row pay for it. Otherwise (fixed k, a schedule) the widest choice stands."""
    if not chosen:
        return 1
    widest = max(k for _, k in chosen) + 1
    policies = [p for p, _ in chosen]
    if len(chosen) < 2 or any(p is None or p.cfg.schedule for p in policies):
        return widest
    costs, n = policies[0].costs, len(chosen)
    rho_v = sum(p.rho_v for p in policies) / n
    rho_spec = sum(p.rho_spec for p in policies) / n  # drafted (multi-position) steps' calibration
    # rows by their policy's costs: the rows of one drafter kind draft a position together (a pool), those
    # of a waiting lookup (free drafts, costs of its own) apart
    groups: dict[int, list[tuple[AdaptivePolicy, int]]] = {}
    for p, k in chosen:
        groups.setdefault(id(p.costs), []).append((p, k))
    best, best_rate = 1, 0.0
    for w in sorted({k + 1 for _, k in chosen} | {1}):
        tokens = sum(expected_tokens(p.beta, min(k, w - 1)) for p, k in chosen)
        drafting = sum(round_draft_cost(g[0][0].costs, sum(p.draft_cost for p, _ in g) / len(g),  # calibrated c
                                        [min(k, w - 1) for _, k in g]) for g in groups.values())
        seconds = (rho_spec if w > 1 else rho_v) * costs.v(n * w) + drafting
        if tokens / seconds > best_rate * (1 + 1e-9):
            best, best_rate = w, tokens / seconds
    return best
