"""Speculation metrics, defined once.

- alpha: per-token acceptance rate = accepted draft tokens / drafted tokens.
- tau: mean accepted length per verify step, counting the recovered/bonus token
  (plain decoding has tau = 1).
- per-position acceptance: for draft position i (1-based), accepted / drafted at that position.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationStats:
    new_tokens: int = 0
    steps: int = 0  # verify steps (the prefill is not a step)
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # verify steps where a drafted token was rejected
    verified_nodes: int = 0  # draft tokens the target scored (a tree's nodes; a chain's length)
    drafted_at: list[int] = field(default_factory=list)  # [position] number of drafts reaching it
    accepted_at: list[int] = field(default_factory=list)  # [position] number accepted there
    emitted_per_step: list[int] = field(default_factory=list)  # accepted + 1, per verify step
    k_chosen: list[int] = field(default_factory=list)  # [k] steps whose draft length was set to k (0 = plain)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    prefill_seconds: float = 0.0  # the target's prefill and the drafter's (also one started mid-answer)
    seconds: float = 0.0
    draft_started_at: int | None = 0  # new tokens before the drafter started (None: it never did)
    lookup_drafted: int = 0  # of `drafted`, the tokens prompt lookup drafted while a draft model waited
    lookup_accepted: int = 0  # of `accepted`, those
    draft_admission: dict | None = None  # the policy's terms when it decided at the start (AdaptivePolicy.last_admission)
    cached_tokens: int = 0  # prompt tokens whose keys/values a prefix cache held (not prefilled)
    load_seconds: float = 0.0  # a draft model's load, deferred to its first start (not in `seconds`)

    def record_choice(self, k: int) -> None:
        if k >= len(self.k_chosen):
            self.k_chosen += [0] * (k + 1 - len(self.k_chosen))
        self.k_chosen[k] += 1

    @property
    def plain_fraction(self) -> float:
        """Fraction of steps the engine ran without drafting (k set to 0)."""
        return self.k_chosen[0] / self.steps if self.steps and self.k_chosen else 0.0

    def record_step(self, num_drafted: int, num_accepted: int, nodes: int | None = None) -> None:
        """num_drafted: the draft's length (a tree's depth); nodes: a tree's size (verified tokens - 1)."""
        self.steps += 1
        self.verified_nodes += num_drafted if nodes is None else nodes
        self.drafted += num_drafted
        self.accepted += num_accepted
        self.rejections += int(num_accepted < num_drafted)
        self.emitted_per_step.append(num_accepted + 1)
        grow = num_drafted - len(self.drafted_at)
        if grow > 0:
            self.drafted_at += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(num_drafted):
            self.drafted_at[i] += 1
            self.accepted_at[i] += int(i < num_accepted)

    @property
    def alpha(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tau(self) -> float:
        return sum(self.emitted_per_step) / self.steps if self.steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict:
        return {"new_tokens": self.new_tokens, "steps": self.steps, "drafted": self.drafted,
                "accepted": self.accepted, "rejections": self.rejections,
                "verified_nodes": self.verified_nodes, "drafted_at": self.drafted_at, "accepted_at": self.accepted_at,
                "alpha": round(self.alpha, 4),
                "tau": round(self.tau, 4),
                "per_position_acceptance": [round(a, 4) for a in self.per_position_acceptance],
                "draft_seconds": round(self.draft_seconds, 4), "verify_seconds": round(self.verify_seconds, 4),
                "prefill_seconds": round(self.prefill_seconds, 4), "seconds": round(self.seconds, 4),
                "load_seconds": round(self.load_seconds, 4),
                "draft_started_at": self.draft_started_at, "draft_admission": self.draft_admission,
                "lookup_drafted": self.lookup_drafted, "lookup_accepted": self.lookup_accepted,
                "tokens_per_second": round(self.tokens_per_second, 3),
                "emitted_per_step": self.emitted_per_step, "k_chosen": self.k_chosen,
                "plain_fraction": round(self.plain_fraction, 4)}

    def line(self) -> str:
        return (f"{self.new_tokens} tokens in {self.seconds:.2f}s ({self.tokens_per_second:.2f} tok/s) | "
                f"steps {self.steps} | tau {self.tau:.2f} | alpha {self.alpha:.2f} | "
                f"draft {self.draft_seconds:.2f}s verify {self.verify_seconds:.2f}s"
                + (f" | draft model loaded at its start in {self.load_seconds:.2f}s" if self.load_seconds else ""))

    def to_dict(self) -> dict:
        return asdict(self)
