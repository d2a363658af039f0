"""The policy's face to the engine: before each step `plan(ask) -> Action`, after it `observe(Outcome)`;
at a request's start `reset()` and `start_now(...)` (does the drafter's prefill pay now?), and
`observe_prefill` for a drafter's measured prefill. `FixedPolicy` is the face without a policy:
every step drafts as far as the engine allows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol


@dataclass(frozen=True)
class Outcome:
    """One verify step, as the policy learns from it (observe)."""

    num_drafted: int  # draft tokens verified (a tree: its depth)
    num_accepted: int  # of them accepted (a tree: its accepted path's length)
    nodes: int | None = None  # the step was a tree of (at most) this many nodes
    confidence: list[float] | None = None  # the target's top probability per verified row, where reported
    draft_seconds: float | None = None  # None: not measured
    verify_seconds: float | None = None  # None: not measured (no calibration from this step)
    batch: int = 1  # sequences verified together
    width: int | None = None  # positions per row of a padded batched verify (default num_drafted + 1)
    forwards: int | None = None  # draft forwards timed (a tree: its chosen depth; default num_drafted)
    free_accepted: int = 0  # tokens accepted beyond those counted above (a grammar's forced ones): the answer's length
    pooled: int = 1  # rows drafted together with this one (draft_seconds: their pooled time's share, over this)


@dataclass(frozen=True)
class Ask:
    """What the engine tells the policy before a step."""

    k_cap: int  # the most draft tokens this step may verify (0: it must be plain)
    batch: int = 1  # sequences verified together in this step
    tree_nodes: int | None = None  # the drafter drafts trees: at most this many nodes fit (None: chains only)
    knows_confidence: bool = False  # the drafter can follow a confidence rule (DraftState.stop)


@dataclass(frozen=True)
class Action:
    """The step the policy chose."""

    k: int  # draft length or tree depth (0: a plain step)
    nodes: int | None = None  # a tree of at most this many nodes (None: the drafter's own size, or a chain)
    tree: bool = True  # False: a tree drafter proposes a chain this step
    stop: Callable[[int, float], int] | None = None  # the confidence rule (DraftState.stop)
    k_stop: int = 0  # under the rule, the chain may grow to this many tokens


class StepPolicy(Protocol):
    wants_target_confidence: bool
    last_admission: dict | None
    waiting: "StepPolicy | None"  # the policy of the steps a drafter drafts by lookup while its model waits

    def reset(self) -> None: ...

    def start_now(self, prefill_len: int, generated: int, max_new_tokens: int, batch: int = 1) -> bool: ...

    def plan(self, ask: Ask) -> Action: ...

    def observe(self, outcome: Outcome) -> None: ...

    def observe_prefill(self, prompt_len: int, seconds: float) -> None: ...

    def observe_waiting(self, outcome: Outcome) -> None: ...


class FixedPolicy:
    """No policy: the drafter starts with every request and each step drafts k_cap (its tree, if any)."""

    wants_target_confidence = False
    last_admission = None
    inner = None
    waiting = None

    def reset(self) -> None:
        pass

    def start_now(self, prefill_len: int, generated: int, max_new_tokens: int, batch: int = 1) -> bool:
        return generated == 0

    def plan(self, ask: Ask) -> Action:
        return Action(ask.k_cap)

    def observe(self, outcome: Outcome) -> None:
        pass

    def observe_prefill(self, prompt_len: int, seconds: float) -> None:
        pass

    def observe_waiting(self, outcome: Outcome) -> None:
        pass
