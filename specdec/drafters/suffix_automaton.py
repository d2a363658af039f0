"""Suffix automata over token ids, for the suffix drafter (drafters/suffix.py) and its datastores
(drafters/datastore.py): a mutable one, extended token by token, and a frozen one in numpy arrays.

Cost. Appending a token is amortised O(1) (suffix automaton construction). Matching is incremental:
each committed token advances the cache and datastore matches in amortised O(1) dict look-ups or
binary searches, and the request match is read off the automaton in O(1); a proposal then walks at
most k transitions. No step scans the text. Measured with a 10^6-token datastore (k = 8, 2-core CPU
shared with a benchmark, 2000 steps): median 47 us, p99 113 us per propose; the first propose of a
request indexes its prompt, O(prompt length) (0.75 ms for 100 tokens). A mutable automaton holds
about 0.5 KB per token (a full default cache: ~0.5 GB); a frozen one about 55 bytes per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import NamedTuple

import numpy as np

from specdec.errors import SpecdecError

SEP = -1  # document separator: never a token id, so no match crosses a document boundary


class Match(NamedTuple):
    """The longest matched suffix: its automaton state and its length in tokens."""

    state: int
    length: int


NO_MATCH = Match(0, 0)


class SuffixAutomaton:
    """An incremental suffix automaton over token ids (ints >= 0), documents split by SEP.

    State 0 is the root (the empty string). Every state keeps its longest string's length, its
    suffix link, its transitions and the end position of its first occurrence in the text.
    """

    def __init__(self) -> None:
        self._text: list[int] = []
        self._length: list[int] = [0]
        self._link: list[int] = [-1]
        self._first_end: list[int] = [-1]
        self._next: list[dict[int, int]] = [{}]
        self._last = 0  # the state of the whole text

    def __len__(self) -> int:
        """Indexed tokens, separators included."""
        return len(self._text)

    @property
    def text(self) -> list[int]:
        """A copy of the indexed tokens (documents joined by SEP)."""
        return list(self._text)

    @property
    def last_token(self) -> int | None:
        return self._text[-1] if self._text else None

    @property
    def num_states(self) -> int:
        return len(self._length)

    def extend(self, token: int) -> None:
        """Append one token (amortised O(1))."""
        lens, link, first, nxt = self._length, self._link, self._first_end, self._next
        pos = len(self._text)
        self._text.append(token)
        cur = len(lens)
        lens.append(pos + 1)
        link.append(0)
        first.append(pos)
        nxt.append({})
        p = self._last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][token]
            if lens[p] + 1 == lens[q]:
                link[cur] = q
            else:  # split q: the clone takes the strings of length <= lens[p] + 1
                clone = len(lens)
                lens.append(lens[p] + 1)
                link.append(link[q])
                first.append(first[q])
                nxt.append(nxt[q].copy())
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self._last = cur

    def add_document(self, tokens: list[int]) -> None:
        """Append a document, after a separator when the text is not empty."""
        if self._text:
            self.extend(SEP)
        for token in tokens:
            self.extend(token)

    def step(self, match: Match, token: int) -> Match:
        """The longest match after appending token to the matched context (amortised O(1))."""
        state, length = match
        nxt, link, lens = self._next, self._link, self._length
        while True:
            target = nxt[state].get(token)
            if target is not None:
                return Match(target, length + 1)
            if state == 0:
                return NO_MATCH
            state = link[state]
            length = lens[state]

    def match(self, tokens: list[int]) -> Match:
        """The longest suffix of tokens that occurs in the text."""
        match = NO_MATCH
        for token in tokens:
            match = self.step(match, token)
        return match

    def repeated_suffix(self) -> Match:
        """The longest suffix of the text that also occurs earlier in it (O(1))."""
        state = self._link[self._last]
        return Match(state, self._length[state]) if state > 0 else NO_MATCH

    def continuation(self, state: int, n: int) -> list[int]:
        """Up to n tokens that followed the first occurrence of the state's strings.

        Where that occurrence ends a document (or the text), the walk moves to another occurrence
        through any other transition; it stops where there is none.
        """
        text, nxt, first = self._text, self._next, self._first_end
        out: list[int] = []
        while len(out) < n:
            pos = first[state] + 1
            token = text[pos] if pos < len(text) else SEP
            if token == SEP:
                token = next((t for t in nxt[state] if t != SEP), SEP)
                if token == SEP:
                    break
            out.append(token)
            state = nxt[state][token]
        return out

    def occurrence_counts(self) -> np.ndarray:
        """# [num_states] int64: how many times each state's strings occur (endpos sizes), O(n)."""
        lens, link, first = self._length, self._link, self._first_end
        counts = [int(lens[v] == first[v] + 1) for v in range(len(lens))]  # states that end a prefix
        counts[0] = 0
        for v in np.argsort(-np.asarray(lens), kind="stable").tolist():
            if v:
                counts[link[v]] += counts[v]
        return np.asarray(counts, dtype=np.int64)

    def freeze(self) -> FrozenSuffixAutomaton:
        """Compact read-only arrays, with each state's most frequent continuation precomputed."""
        num_states = self.num_states
        counts = self.occurrence_counts()
        degree = np.fromiter(map(len, self._next), np.int64, num_states)
        num_edges = int(degree.sum())
        src = np.repeat(np.arange(num_states), degree)
        tok = np.fromiter(chain.from_iterable(self._next), np.int64, num_edges)
        dst = np.fromiter(chain.from_iterable(d.values() for d in self._next), np.int64, num_edges)
        order = np.lexsort((tok, src))  # by state, then token
        tok, dst = tok[order], dst[order]
        offsets = np.zeros(num_states + 1, np.int64)
        np.cumsum(degree, out=offsets[1:])
        # best edge per state: most occurrences, then earliest first occurrence; never a separator
        score = np.where(tok == SEP, -1, counts[dst])
        ranked = np.lexsort((np.asarray(self._first_end)[dst], -score, src))
        has_edges = np.flatnonzero(degree)
        head = ranked[offsets[has_edges]]
        real = score[head] >= 0
        best_token = np.full(num_states, SEP, np.int64)
        best_target = np.full(num_states, -1, np.int64)
        best_token[has_edges[real]] = tok[head[real]]
        best_target[has_edges[real]] = dst[head[real]]
        return FrozenSuffixAutomaton.from_arrays(dict(
            length=np.asarray(self._length), link=np.asarray(self._link), counts=counts, edge_offsets=offsets,
            edge_tokens=tok, edge_targets=dst, best_token=best_token, best_target=best_target))


@dataclass(frozen=True, eq=False)
class FrozenSuffixAutomaton:
    """A read-only suffix automaton as int32 numpy arrays (transitions in CSR form, sorted by token)."""

    length: np.ndarray  # [S] longest string per state
    link: np.ndarray  # [S] suffix link (-1 for the root)
    counts: np.ndarray  # [S] occurrences of the state's strings
    edge_offsets: np.ndarray  # [S + 1] state s's edges are [edge_offsets[s], edge_offsets[s + 1])
    edge_tokens: np.ndarray  # [E] sorted within each state
    edge_targets: np.ndarray  # [E]
    best_token: np.ndarray  # [S] most frequent next token (SEP: none)
    best_target: np.ndarray  # [S] the state it leads to (-1: none)

    STATE_ARRAYS = ("length", "link", "counts", "best_token", "best_target")
    EDGE_ARRAYS = ("edge_tokens", "edge_targets")

    @staticmethod
    def from_arrays(arrays: dict[str, np.ndarray]) -> FrozenSuffixAutomaton:
        """Rebuild from saved arrays; ValueError when they are inconsistent."""
        names = FrozenSuffixAutomaton.STATE_ARRAYS + FrozenSuffixAutomaton.EDGE_ARRAYS + ("edge_offsets",)
        a = {name: np.asarray(arrays[name]) for name in names}
        if any(not np.issubdtype(v.dtype, np.integer) for v in a.values()):
            raise ValueError("suffix automaton arrays must hold integers")
        a = {name: v.astype(np.int32, copy=False) for name, v in a.items()}
        num_states, num_edges = len(a["length"]), len(a["edge_tokens"])
        offsets = a["edge_offsets"]
        if (num_states == 0 or any(a[n].shape != (num_states,) for n in FrozenSuffixAutomaton.STATE_ARRAYS)
                or any(a[n].shape != (num_edges,) for n in FrozenSuffixAutomaton.EDGE_ARRAYS)
                or offsets.shape != (num_states + 1,) or offsets[0] != 0 or offsets[-1] != num_edges
                or np.any(np.diff(offsets) < 0)
                or not _in_range(a["edge_targets"], 0, num_states) or not _in_range(a["link"], -1, num_states)
                or not _in_range(a["best_target"], -1, num_states)):
            raise ValueError("inconsistent suffix automaton arrays")
        return FrozenSuffixAutomaton(**a)

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in self.STATE_ARRAYS + self.EDGE_ARRAYS + ("edge_offsets",)}

    def _goto(self, state: int, token: int) -> int:
        """The transition on token, or -1 (binary search over the state's edges)."""
        lo, hi = int(self.edge_offsets[state]), int(self.edge_offsets[state + 1])
        i = lo + int(self.edge_tokens[lo:hi].searchsorted(token))
        return int(self.edge_targets[i]) if i < hi and self.edge_tokens[i] == token else -1

    def step(self, match: Match, token: int) -> Match:
        """The longest match after appending token to the matched context (amortised O(log degree))."""
        state, length = match
        while True:
            target = self._goto(state, token)
            if target >= 0:
                return Match(target, length + 1)
            if state == 0:
                return NO_MATCH
            state = int(self.link[state])
            length = int(self.length[state])

    def match(self, tokens: list[int]) -> Match:
        """The longest suffix of tokens that occurs in the text."""
        match = NO_MATCH
        for token in tokens:
            match = self.step(match, token)
        return match

    def continuations(self, state: int) -> list[tuple[int, int]]:
        """(next token, occurrences) for every way the state's strings continue, most frequent first."""
        lo, hi = int(self.edge_offsets[state]), int(self.edge_offsets[state + 1])
        pairs = [(int(t), int(self.counts[d])) for t, d in zip(self.edge_tokens[lo:hi], self.edge_targets[lo:hi])
                 if t != SEP]
        return sorted(pairs, key=lambda pair: -pair[1])

    def continuation(self, state: int, n: int) -> list[int]:
        """Up to n tokens, each the most frequent continuation of the context so far."""
        out: list[int] = []
        while len(out) < n and self.best_target[state] >= 0:
            out.append(int(self.best_token[state]))
            state = int(self.best_target[state])
        return out


def _in_range(values: np.ndarray, lo: int, hi: int) -> bool:
    return values.size == 0 or (int(values.min()) >= lo and int(values.max()) < hi)
