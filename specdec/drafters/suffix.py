"""Suffix drafting (SuffixDecoding / REST style): propose what followed the longest matching suffix.

Three sources, each a suffix automaton over token ids:

- request: this request's prompt + output, extended as tokens are committed;
- cache: earlier requests (prompt + output), at most max_cache_tokens, oldest evicted first;
- datastore: an optional read-only corpus (drafters/datastore.py), frozen into numpy arrays.

Proposal rule. Each source reports the longest suffix of the committed tokens that occurs in it
(for the request: that occurs earlier, so something followed it). The longest match wins; ties go to
the request, then the cache, then the datastore. A match shorter than min_match proposes nothing.
A match of m tokens proposes min(k, m + 1) tokens, read by walking the automaton from the matched
state: request and cache follow the first occurrence (moving to another occurrence where a document
ends), the datastore follows the most frequent continuation (largest occurrence count per step).

Cost: see drafters/suffix_automaton.py (amortised O(1) per committed token; a proposal walks at most
k transitions). The cache evicts whole documents, oldest first, down to 3/4 of its bound and rebuilds
its automaton: at most 3 re-insertions per token (amortised O(1)).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from specdec.drafters.base import BaseDrafter, DraftState
from specdec.drafters.datastore import load_datastore, tokenizer_fingerprint
from specdec.drafters.registry import Entry
from specdec.drafters.suffix_automaton import NO_MATCH, SuffixAutomaton
from specdec.errors import SpecdecError
from specdec.tree import DraftTree

SUFFIX_BYTES_PER_TOKEN = 512  # a mutable suffix automaton, per indexed token (memory per server slot)


@dataclass(frozen=True)
class SuffixConfig:
    """Suffix/retrieval drafting: a bounded cache of earlier requests, and an optional datastore file."""

    cache_tokens: int = 262144  # earlier requests' tokens kept (oldest evicted); 0 = no cache
    min_match: int = 1
    datastore: str | None = None  # a file from `specdec datastore build`

    def __post_init__(self):
        if self.cache_tokens < 0 or self.min_match < 1:
            raise SpecdecError(f"suffix drafting needs cache_tokens >= 0 and min_match >= 1, "
                               f"got {self.cache_tokens}, {self.min_match}")


class DocumentCache:
    """Earlier requests in one automaton, at most max_tokens long (separators included).

    Over the bound, the oldest documents go until at most 3/4 of it is left, and the automaton is
    rebuilt from the rest (amortised O(1) per added token). A document keeps its last tokens only.
    """

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._keep = max_tokens * 3 // 4
        self._docs: deque[list[int]] = deque()
        self._size = 0  # sum of len(doc) + 1 over documents
        self.automaton = SuffixAutomaton()

    def add(self, doc: list[int]) -> None:
        limit = self._keep - 1  # the newest document, with its separator, always fits in 3/4
        if limit <= 0 or not doc:
            return
        doc = doc[-limit:]
        self._docs.append(doc)
        self._size += len(doc) + 1
        if self._size <= self.max_tokens:
            self.automaton.add_document(doc)
            return
        while self._size > self._keep:
            self._size -= len(self._docs.popleft()) + 1
        self.automaton = SuffixAutomaton()
        for kept in self._docs:
            self.automaton.add_document(kept)


class SuffixDrafter(BaseDrafter):
    """Proposes the continuation of the longest suffix match in this request, earlier requests
    or a datastore (see the module docstring for the rule). Deterministic: q is one-hot (None).

    The cache of earlier requests persists across start() calls: start() files the previous
    request (prompt + the tokens seen at its last proposal) before the new one begins.
    """

    def __init__(self, max_cache_tokens: int = 1_000_000, min_match: int = 1, datastore=None):
        """datastore: a drafters.datastore.Datastore (its frozen `automaton` is what a proposal reads), or None."""
        if max_cache_tokens < 0:
            raise SpecdecError(f"max_cache_tokens must be >= 0 (0 = no cache), got {max_cache_tokens}")
        if min_match < 1:
            raise SpecdecError(f"min_match must be >= 1, got {min_match}")
        self.min_match = min_match
        self.datastore = datastore
        self._cache = DocumentCache(max_cache_tokens)
        self._request = SuffixAutomaton()
        self._cache_match = self._store_match = NO_MATCH

    @property
    def cache_tokens(self) -> int:
        """Tokens held by the cache of earlier requests (separators included)."""
        return len(self._cache.automaton)

    def start(self, prompt: list[int]) -> None:
        if len(self._request):
            self._cache.add(self._request.text)
        self._new_request()

    def _new_request(self) -> None:
        self._request = SuffixAutomaton()
        self._cache_match = self._store_match = NO_MATCH

    def _sync(self, tokens: list[int]) -> None:
        """Index the committed tokens not seen yet and advance the matches by them.

        A sequence that does not extend the indexed one (no start() in between) starts afresh;
        drafts only affect speed, so the check looks at the last indexed token alone.
        """
        seen = len(self._request)
        if seen > len(tokens) or (seen and tokens[seen - 1] != self._request.last_token):
            self._new_request()
            seen = 0
        cache, store = self._cache.automaton, self.datastore.automaton if self.datastore else None
        for token in tokens[seen:]:
            self._request.extend(token)
            self._cache_match = cache.step(self._cache_match, token)
            if store is not None:
                self._store_match = store.step(self._store_match, token)

    def propose(self, state: DraftState) -> DraftTree:
        self._sync(state.tokens)
        sources = [(self._request.repeated_suffix(), self._request), (self._cache_match, self._cache.automaton)]
        if self.datastore is not None:
            sources.append((self._store_match, self.datastore.automaton))
        for match, source in sorted(sources, key=lambda s: -s[0].length):  # stable: ties keep source order
            if match.length < self.min_match:
                break
            tokens = source.continuation(match.state, min(state.k, match.length + 1))
            if tokens:
                return DraftTree.chain(torch.tensor(tokens, dtype=torch.long))
        return DraftTree.empty()

    def observe(self, num_accepted: int) -> None:
        pass


def add_flags(p) -> None:
    p.add_argument("--suffix-cache-tokens", type=int, default=262144,
                   help="suffix drafter: tokens of earlier requests kept (oldest evicted first; 0 = none)")
    p.add_argument("--suffix-min-match", type=int, default=1, help="suffix drafter: shortest match that drafts")
    p.add_argument("--datastore", default=None, help="suffix drafter: a file from `specdec datastore build`")


def _build(parts, options, note):
    s = options.of("suffix")
    store = load_datastore(s.datastore, tokenizer_fingerprint(parts.target.tokenizer)) if s.datastore else None
    return SuffixDrafter(s.cache_tokens, s.min_match, store)


DRAFTERS = [(Entry("suffix", _build, settings=SuffixConfig, flags=add_flags, chain_theory=True,
                   from_flags=lambda v: SuffixConfig(v["suffix_cache_tokens"], v["suffix_min_match"], v["datastore"]),
                   needs_switch={"datastore": "--datastore"},
                   slot_bytes=lambda o: SUFFIX_BYTES_PER_TOKEN * o.of("suffix").cache_tokens,
                   switch="draft by suffix matching over this request, earlier requests and an optional datastore"),
             {})]
