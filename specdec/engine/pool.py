"""The slots behind the engine: slot b is row b of one batched target KV cache, with its own drafter
and its own policy, all sharing the target's weights.

Prefix caching: a free slot keeps the keys/values its last sequence left (prompt and answer), and
the tokens they belong to. A new request takes the free slot holding the longest prefix of its
prompt, and prefills only the rest (the next turn of a conversation, a shared system prompt); with
no such slot, the least recently used one, so the caches of recent conversations live longest. The
prefix cache is the slots' own rows: it takes no memory beyond them. Keys and values of a position
depend on the tokens up to it alone, so the reused ones are what a prefill would write, and greedy
output is the same with and without it. A slot's drafter reuses its own state the same way (a draft
model its cache, a head its features). A request that asks for its prompt's logprobs needs the logits
of every prompt position, so it prefills its whole prompt.

A running sequence whose prefill is done shares its prompt too: a request whose prompt starts with it
gets those keys/values copied from that sequence's row into its own (several samples of one prompt,
`n` > 1; the same system prompt from several clients at once). The engine holds such a request back
while the sequence it would share with is still prefilling (`shares_a_prefill`).

Pooled drafters' caches (a draft model's, or a head's) become rows of one batched cache, so that a
step drafts for every sequence in one forward per position (`propose_pooled`); with one slot there is
nothing to pool.
"""

from __future__ import annotations

from typing import Callable

from specdec.drafters.base import Drafter
from specdec.engine.step import Sequence, prefill_from
from specdec.errors import SpecdecError
from specdec.model.transformer import Transformer
from specdec.policy import FixedPolicy
from specdec.tokens import common_prefix


class SlotPool:
    """`max_batch` slots: cache rows, drafters and policies; which are free; what each free one holds."""

    def __init__(self, target: Transformer, drafter_factory: Callable[[], Drafter], capacity: int, max_batch: int,
                 policy_factory: Callable[[], object] | None = None, batched: bool = True,
                 prefix_cache: bool = True, cache=None):
        """cache: a target cache of one row to use (max_batch 1), shared with a drafter built over it."""
        if max_batch < 1:
            raise SpecdecError(f"max_batch must be >= 1, got {max_batch}")
        if cache is not None and max_batch != 1:
            raise SpecdecError("a given target cache serves one slot only")
        self.cache = cache if cache is not None else target.new_cache(capacity, batch=max_batch)  # row b: slot b's
        self.rows = [self.cache] if max_batch == 1 else [self.cache.row(b) for b in range(max_batch)]
        self.drafters = [drafter_factory() for _ in range(max_batch)]
        for drafter, row in zip(self.drafters, self.rows):
            if drafter.caps.target_cache and row is not cache:  # it drafts into its slot's row (layer skip)
                drafter.share_target_cache(row)
        self.adaptive = policy_factory is not None  # every slot's policy has a cost model (round_width reads it)
        self.policies = [policy_factory() if policy_factory else FixedPolicy() for _ in range(max_batch)]
        self.free: list[int] = list(range(max_batch))
        self.prefix_cache = prefix_cache
        self.held: list[list[int]] = [[] for _ in range(max_batch)]  # tokens whose keys/values slot b holds
        self.used = [0] * max_batch  # when each slot was last taken (a counter), for least-recently-used
        self.clock = 0
        self.draft_cache = None
        if batched and max_batch > 1 and all(d.caps.pooled for d in self.drafters):
            self.draft_cache = self.drafters[0].pool_model.new_pool_cache(max_batch)
            for b, d in enumerate(self.drafters):
                d.pool_model.cache = self.draft_cache.row(b)

    @property
    def capacity(self) -> int:
        """Context of every slot, in tokens (the cache capacity, capped by the model's positions)."""
        return self.cache.capacity

    @property
    def max_batch(self) -> int:
        return len(self.drafters)

    @property
    def tree_nodes(self) -> int:
        """Scratch slots a draft tree needs past the end of a sequence (0 for chains)."""
        return self.drafters[0].caps.tree_nodes

    def seat(self, seq: Sequence, running: list[Sequence] = ()) -> None:
        """A free slot for the sequence: its cache row, drafter and policy; the cached prefix of its
        prompt stays in place, or a longer one is copied from a running sequence's row, and its prefill
        starts after it."""
        if not self.free:
            raise SpecdecError("no free slot")
        slot, reuse = self._slot_for(seq.tokens)
        if seq.cfg.prompt_logprobs:  # every prompt position's logits are asked: the whole prompt is prefilled
            reuse = 0
        elif self.prefix_cache:
            source, shared = self._live_prefix(seq.tokens, running)
            if shared > reuse:
                self._copy_prefix(source.row, slot, shared)
                reuse = shared
        self.free.remove(slot)
        self.clock += 1
        self.used[slot] = self.clock
        seq.row, seq.cache, seq.drafter, seq.policy = slot, self.rows[slot], self.drafters[slot], self.policies[slot]
        prefill_from(seq, reuse)
        self.held[slot] = []

    def _slot_for(self, prompt: list[int]) -> tuple[int, int]:
        """(the free slot for this prompt, the prompt tokens whose keys/values it holds already): the
        longest cached prefix, else the least recently used slot. At least the prompt's last token is
        always prefilled (its logits give the first new token)."""
        if not self.prefix_cache:
            return self.free[0], 0
        best = max(self.free, key=lambda b: (min(common_prefix(self.held[b], prompt), len(prompt) - 1),
                                             -self.used[b]))
        return best, min(common_prefix(self.held[best], prompt), len(prompt) - 1)

    @staticmethod
    def _live_prefix(prompt: list[int], running: list[Sequence]) -> tuple[Sequence | None, int]:
        """(the running sequence whose committed keys/values hold the longest prefix of this prompt,
        that prefix's length; at most all but the prompt's last token), or (None, 0)."""
        best, shared = None, 0
        for s in running:
            if s.prefilled < s.prompt_len or s.finish_reason is not None:
                continue
            n = min(common_prefix(s.tokens[:s.cache.length], prompt), len(prompt) - 1)
            if n > shared:
                best, shared = s, n
        return best, shared

    def _copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Slots 0..n-1 of row src's keys/values into row dst (whose cached tokens are dropped)."""
        to, of = self.rows[dst], self.rows[src]
        to.k[:, :, :, :n] = of.k[:, :, :, :n]
        to.v[:, :, :, :n] = of.v[:, :, :, :n]
        to.length = n
        self.held[dst] = []

    def release(self, seq: Sequence) -> None:
        """The sequence's slot is free; it holds the committed tokens' keys/values for a later prefix
        (none after an error: a failed step may have left them half written)."""
        self.free.append(seq.row)
        self.held[seq.row] = [] if seq.finish_reason == "error" else seq.tokens[:min(seq.cache.length,
                                                                                       len(seq.tokens))]
