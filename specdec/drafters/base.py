"""The Drafter protocol: propose a DraftTree from the committed tokens; observe the outcome.

What a drafter can do beyond that is data (`Capabilities`), read by the engine; `BaseDrafter`
gives every optional method a default, so the engine never probes a drafter for one."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

import torch

from specdec.config import SamplingParams
from specdec.drafters.registry import Entry
from specdec.model.timing import timed
from specdec.tree import DraftTree

if TYPE_CHECKING:
    from specdec.sampling.verify import Verified


@dataclass
class DraftState:
    """What a drafter sees: the committed sequence and how much to propose."""

    tokens: list[int]  # prompt + generated tokens so far (committed)
    k: int  # maximum number of draft tokens to propose (for a tree: its maximum depth)
    sampling: SamplingParams
    generator: torch.Generator | None  # for stochastic drafters; None under greedy
    max_nodes: int | None = None  # a tree may have at most this many nodes (the context room left)
    tree: bool = True  # False: a drafter configured for trees proposes a chain this step (the policy's choice)
    # A confidence rule (the adaptive policy's): a drafter that knows its own confidence may draft up to
    # k_stop tokens (>= k) and calls stop(i, p) before drafting token i + 1 (i drafted so far), p the top
    # probability of its distribution there: END (0) ends the chain without it, LAST (1) drafts it and
    # ends, GO_ON (2) drafts it and goes on. Other drafters ignore both.
    stop: Callable[[int, float], int] | None = None
    k_stop: int = 0
    # Structured output: mask(drafted) is the grammar's allowed target ids, bool # [vocab], after
    # tokens + drafted (None where the grammar rejects drafted). A drafter whose ids are the target's
    # may draft from its masked distribution (its q is then that one); None: no grammar.
    mask: Callable[[list[int]], torch.Tensor | None] | None = None
    # forced(n, drafted): the tokens the grammar forces (it allows exactly one) after tokens + drafted, at
    # most n. A drafter may put them in its chain wherever they come (q one-hot) and draft past them:
    # they are free, so they do not count against k, only against `room`; None: no grammar.
    forced: Callable[[int, list[int]], list[int]] | None = None
    room: int = 0  # under a grammar: the most tokens a chain may hold, forced ones included (>= limit)
    # A request's logit bias and penalties: penalize(logits, drafted) is logits # [vocab] as the target's row
    # after tokens + drafted is penalised (sampling/penalties.py). A drafter whose ids are the target's may
    # draft from the penalised distribution (its q is then that one), so it guesses what the target keeps;
    # None: the request has none.
    penalize: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = None

    @property
    def limit(self) -> int:
        """The most tokens a chain may have: k, or k_stop under a confidence rule."""
        return max(self.k, self.k_stop) if self.stop is not None else self.k

    @property
    def most(self) -> int:
        """The most tokens a chain may hold: its limit, and the grammar's forced tokens within `room`."""
        return max(self.limit, self.room) if self.forced is not None else self.limit


END, LAST, GO_ON = 0, 1, 2  # a confidence rule's answers (DraftState.stop)


@dataclass(frozen=True)
class Capabilities:
    """What a drafter does beyond proposing chains, as the engine reads it."""

    drafts: bool = True  # False: proposes nothing (plain decoding through the same engine)
    tree_nodes: int = 0  # > 0: proposes token trees of up to this many nodes (scratch slots past the end)
    own_verify: bool = False  # a drafting step is verified by the drafter's own forward (`verify`)
    pooled: bool = False  # its chains can be drafted for many rows in one forward (`pool_model`)
    lookup_only: bool = False  # can draft by lookup alone, without its model's prefill (`start_lookup_only`)
    knows_confidence: bool = False  # honours DraftState.stop (the policy's confidence rule)
    features: bool = False  # drafts from the target's features: prefill and verify hand them over (`feed`)
    target_cache: bool = False  # drafts into the target's own cache: a slot pool hands it its row (`share_target_cache`)


class Drafter(Protocol):
    caps: Capabilities
    # caps.pooled: the drafter (a draft model's, a head's) whose chains a pool drafts together: its
    # new_pool_cache(batch) is the pool's cache (each drafter's `cache` one row of it), and
    # propose_pooled(models, states, cache, rows) drafts for all rows at once
    pool_model: object | None

    def start(self, prompt: list[int]) -> None:
        """A new sequence begins with this prompt."""

    def load(self) -> float:
        """Loads what the drafter defers to its first start (a draft model's weights); the seconds it
        took, 0.0 where nothing was left to load. The engine calls it before timing the start."""

    def propose(self, state: DraftState) -> DraftTree:
        """Propose up to state.k draft tokens to follow state.tokens."""

    def observe(self, num_accepted: int) -> None:
        """How many of the last proposal's tokens the target accepted."""

    def prefill_tokens(self, prompt_len: int) -> int:
        """Tokens start() feeds a model for a prompt of this length (what its prefill costs)."""

    def held(self, prompt: list[int]) -> int:
        """Of the prefill_tokens that start(prompt) would feed, how many its cache holds already from the
        text it last saw (kept, not fed again): what a prefill of this prompt saves now."""

    def start_lookup_only(self, prompt: list[int]) -> None:
        """caps.lookup_only: this sequence drafts by lookup alone; the model is not started."""

    def lookup(self, state: DraftState) -> DraftTree | None:
        """caps.pooled: this step's draft by lookup, or None when `pool_model` must draft it."""

    def feed(self, position: int, features: torch.Tensor) -> None:
        """caps.features: the target's features # [n, hidden] (its final norm's output) of the committed
        positions position..position+n-1, from the prefill and each verify."""

    def verify(self, target, cache, last_token: int, tree: DraftTree, sampling: SamplingParams,
               generator: torch.Generator | None, masks: torch.Tensor | None = None) -> "Verified":
        """caps.own_verify: verify [last token] + tree in the drafter's own forward, under the grammar's
        masks # [1 + nodes, vocab] where given (or the request's penalties with them: sampling.penalties.Rules,
        which sampling.verify's accept_chain and accept_tree apply). Moves no cache: it reports the slots it wrote
        (Verified.written); the engine's commit moves the cache."""

    def share_target_cache(self, cache) -> "Drafter":
        """caps.target_cache: draft into `cache`, the target's cache of every sequence this drafter serves."""


class BaseDrafter:
    """Defaults for the protocol's optional parts: chains only, verified by the engine."""

    caps = Capabilities()
    pool_model = None

    def load(self) -> float:
        return 0.0

    def prefill_tokens(self, prompt_len: int) -> int:
        return prompt_len  # priced by the policy's measured prefill cost (zero for lookup drafters)

    def held(self, prompt: list[int]) -> int:
        return 0

    def start_lookup_only(self, prompt: list[int]) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot draft by lookup alone")

    def lookup(self, state: DraftState) -> DraftTree | None:
        return None

    def feed(self, position: int, features: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not read the target's features")

    def verify(self, target, cache, last_token, tree, sampling, generator, masks=None):
        raise NotImplementedError(f"{type(self).__name__} has no verify forward of its own")

    def share_target_cache(self, cache):
        raise NotImplementedError(f"{type(self).__name__} does not draft into the target's cache")

    def observe(self, num_accepted: int) -> None:
        pass

    def entry(self, context: int = 256):
        """caps.features: a callable drafting one token at `context` cached positions (for its cost c)."""
        raise NotImplementedError(f"{type(self).__name__} does not time its own draft token")

    def step_seconds(self, context: int = 256, repeats: int = 5) -> float:
        """Median seconds of one draft token (entry) at `context` cached positions; the drafter is
        started afresh afterwards."""
        run = self.entry(context)
        seconds = statistics.median(timed(run, self.features.device, repeats))
        self.start([])
        return seconds

    def rows_entry(self, rows: int, context: int = 256):
        """caps.pooled without a cost_model(): a callable of one pooled draft position over `rows` rows of
        a pool's cache at `context` cached entries (for its row curve d(n)); None: not timed."""
        return None

    def row_costs(self, batches, context: int = 256, repeats: int = 5) -> dict[int, float] | None:
        """d(n) at the row counts `batches` (n rows of a pooled draft position against one row's, never
        less at more rows), timed with rows_entry; None where the drafter does not time it."""
        first = self.rows_entry(1, context)
        if first is None:
            return None
        device = self.features.device  # a drafter with rows_entry reads the target's features

        def seconds(n: int) -> float:
            return statistics.median(timed(first if n == 1 else self.rows_entry(n, context), device, repeats))
        one, curve, floor = seconds(1), {1: 1.0}, 1.0
        for n in sorted(set(batches) - {1}):
            floor = curve[n] = max(floor, seconds(n) / one)
        return curve

    # ---- cost hints, for the adaptive policy (engine/build.py's build_policy) ----

    def cost_model(self):
        """The model (a Transformer) whose forward one draft token runs; the policy times it against the
        target's for c and prices its prefill. None: a lookup (c about 0) or a cost of its own
        (adjust_costs)."""
        return None

    def adjust_costs(self, costs, target, measured: bool) -> None:
        """Corrects the costs (a policy.CostModel; measured now, or read from a profile) in place where a
        draft token is not one forward of cost_model(). A drafter that reads the target's features (a
        head) times its own draft token."""
        if self.caps.features and measured and costs.step_seconds:
            costs.draft_cost = self.step_seconds() / costs.step_seconds

    def tree_actions(self) -> dict:
        """The tree sizes it offers the policy besides chains (PolicyConfig's tree_sizes, tree_depth)."""
        return {}


class NoDrafter(BaseDrafter):
    """Plain decoding through the same engine: proposes nothing."""

    caps = Capabilities(drafts=False)

    def start(self, prompt: list[int]) -> None:
        pass

    def propose(self, state: DraftState) -> DraftTree:
        return DraftTree.empty()


def _none(parts, options, note):
    return NoDrafter()


DRAFTERS = [(Entry("none", _none, lambda p, o, d: "plain", drafts=False, chosen_by=()), {"plain": {}})]
