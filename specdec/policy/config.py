"""The policy's settings (PolicyConfig, validated on construction) and a fixed k schedule's parser."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import SpecdecError


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
    learn_budget: float = 0.05  # admission: a prefill's part per token allowed with no predicted saving, x the expected answer
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
