"""Lookahead decoding (Fu et al. 2024): Jacobi iteration over a 2-D window feeds an n-gram pool, and
pool n-grams that start with the last committed token are verified, all in one target forward.

The window holds up to L = N - 1 levels of W guessed tokens. Level r, column c sits at offset
r + 1 + c after the root (the last committed token). Token (r, c) attends to the committed prefix,
the root, level 0's columns 0..c and levels 1..r of its own column c: read in position order that is
one ordinary sequence (offsets 1..c+1 on level 0, then c+2..c+1+r up the column), so its output is a
Jacobi guess for offset r + c + 2. The top level's outputs form the next level; the oldest level is
dropped. Each column then gives an N-gram: the column's tokens bottom to top plus the new output,
stored in the pool under its first token.

The verification branch is a token tree (a trie of up to G pool n-grams whose first token is the
root), verified by the engine's ordinary tree acceptance, so decoding stays lossless: greedy output
equals plain decoding, and sampling uses multi-candidate rejection sampling with one-hot drafts.
Window tokens never enter the accepted path: tree nodes and the root do not see them, and
`KVCache.keep` drops their keys/values after the step.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass

import torch

from specdec.drafters.base import BaseDrafter, Capabilities, DraftState
from specdec.drafters.registry import Entry
from specdec.errors import SpecdecError
from specdec.model.kv_cache import KVCache
from specdec.model.transformer import Transformer
from specdec.sampling.verify import Verified, accept_tree
from specdec.tree import DraftTree


@dataclass(frozen=True)
class LookaheadConfig:
    """Lookahead decoding: a Jacobi window of `window` columns and ngram - 1 levels, and at most
    `candidates` pool n-grams verified per step."""

    window: int = 3
    ngram: int = 3
    candidates: int = 3

    def __post_init__(self):
        if self.window < 1 or self.ngram < 2 or self.candidates < 1:
            raise SpecdecError(f"lookahead needs window >= 1, ngram >= 2 and candidates >= 1, got "
                               f"{self.window}, {self.ngram}, {self.candidates}")


def window_layout(levels: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets # [levels * width] (after the root) and the mask # [levels * width, levels * width] among
    window tokens, row-major (level r, column c at index r * width + c)."""
    r = torch.arange(levels).repeat_interleave(width)  # [m]
    c = torch.arange(width).repeat(levels)  # [m]
    offsets = r + 1 + c
    lower_on_level0 = (r[None, :] == 0) & (c[None, :] <= c[:, None])  # level 0, columns 0..c
    same_column_below = (c[None, :] == c[:, None]) & (r[None, :] <= r[:, None])  # levels 0..r of column c
    return offsets, lower_on_level0 | same_column_below


class LookaheadDrafter(BaseDrafter):
    """window W, n-gram size N (>= 2, so N - 1 levels), at most G candidate n-grams verified per step."""

    def __init__(self, window: int = 4, ngram: int = 3, candidates: int = 4, seed: int = 0):
        if window < 1:
            raise SpecdecError(f"lookahead window must be >= 1, got {window}")
        if ngram < 2:
            raise SpecdecError(f"lookahead n-gram size must be >= 2, got {ngram}")
        if candidates < 1:
            raise SpecdecError(f"lookahead candidates must be >= 1, got {candidates}")
        self.window, self.ngram, self.candidates = window, ngram, candidates
        self.levels_max = ngram - 1
        self.rng = random.Random(seed)
        self.levels: list[list[int]] = []
        self.pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        # scratch context slots one step needs past the committed text: tree nodes + window
        self.max_tree_nodes = candidates * (ngram - 1) + self.levels_max * window
        self.caps = Capabilities(tree_nodes=self.max_tree_nodes, own_verify=True)  # the window rides in verify
        self.window_tokens = 0  # window tokens fed in the last step (stats)

    def start(self, prompt: list[int]) -> None:
        """Level 0 starts as tokens drawn from the prompt (as the paper's reference code does)."""
        self.levels = [[self.rng.choice(prompt) for _ in range(self.window)]]
        self.pool = {}

    def pool_size(self) -> int:
        return sum(len(v) for v in self.pool.values())

    def add_ngram(self, gram: tuple[int, ...]) -> None:
        """Store gram[1:] under gram[0]; each key keeps its G most recent distinct continuations."""
        conts = self.pool.setdefault(gram[0], OrderedDict())
        conts.pop(gram[1:], None)
        conts[gram[1:]] = None
        while len(conts) > self.candidates:
            conts.popitem(last=False)

    def propose(self, state: DraftState) -> DraftTree:
        """A trie of the pool's continuations of the last token (most recent first), depth <= k."""
        room = (state.max_nodes if state.max_nodes is not None else 1 << 30) - self.levels_max * self.window
        conts = list(reversed(self.pool.get(state.tokens[-1], {})))
        tokens: list[int] = []
        parents: list[int] = []
        index: dict[tuple[int, ...], int] = {}
        for cont in conts:
            for d in range(1, min(len(cont), state.k) + 1):
                key = cont[:d]
                if key in index:
                    continue
                if len(tokens) >= room:
                    break
                index[key] = len(tokens)
                tokens.append(key[-1])
                parents.append(index[key[:-1]] if d > 1 else -1)
        # nodes come out parent-first per candidate, so parents[i] < i (topological order)
        return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))

    def verify(self, target: Transformer, cache: KVCache, last_token: int, tree: DraftTree, sampling,
               generator: torch.Generator, masks: torch.Tensor | None = None) -> Verified:
        """One forward over [root] + tree nodes + window; accept on the tree (under the grammar's masks
        # [1 + n, vocab] where given), advance the window."""
        device = cache.k.device
        start, n = cache.length, len(tree)
        levels = self.levels
        m = len(levels) * self.window
        if start + 1 + n + m > cache.capacity:  # no room for the window at the very end: verify the tree alone
            levels, m = [], 0
        offsets, wmask = window_layout(len(levels), self.window)
        x = torch.tensor([last_token] + tree.tokens.tolist() + [t for level in levels for t in level],
                         device=device).unsqueeze(0)  # [1, 1 + n + m]
        positions = start + torch.cat([tree.position_offsets(), offsets]).to(device).unsqueeze(0)  # [1, 1 + n + m]
        mask = torch.zeros(1 + n + m, start + 1 + n + m, dtype=torch.bool)
        mask[:, :start + 1] = True  # committed prefix and the root
        mask[:1 + n, start:start + 1 + n] = tree.tree_mask()
        mask[1 + n:, start + 1 + n:] = wmask
        logits = target(x, cache, start, positions=positions, mask=mask.to(device))[0]  # [1 + n + m, vocab]
        if m:
            self._advance_window(logits[1 + n:].argmax(-1).view(len(levels), self.window).tolist())
        self.window_tokens = m
        rows = logits[:1 + n]  # [1 + n, vocab] of [root] + tree nodes
        return Verified.of_tree(accept_tree(tree, rows, sampling, generator, None, masks), 1 + n + m, rows)

    def _advance_window(self, outputs: list[list[int]]) -> None:
        """outputs[r][c]: the window's argmax guesses; the top level's become the next level."""
        new = outputs[-1]
        if len(self.levels) == self.levels_max:
            for c in range(self.window):
                self.add_ngram(tuple(level[c] for level in self.levels) + (new[c],))
            self.levels = self.levels[1:]
        self.levels = self.levels + [new]


def add_flags(p) -> None:
    p.add_argument("--lookahead-window", type=int, default=3, help="lookahead: window width W (columns)")
    p.add_argument("--lookahead-ngram", type=int, default=3, help="lookahead: n-gram size N (N - 1 levels)")
    p.add_argument("--lookahead-candidates", type=int, default=3,
                   help="lookahead: at most G pool n-grams verified per step")


def _build(parts, options, note):
    la = options.of("lookahead")
    return LookaheadDrafter(la.window, la.ngram, la.candidates)


DRAFTERS = [(Entry("lookahead", _build, settings=LookaheadConfig, flags=add_flags,
                   from_flags=lambda v: LookaheadConfig(v["lookahead_window"], v["lookahead_ngram"],
                                                        v["lookahead_candidates"]),
                   switch="lookahead decoding: Jacobi iteration feeds an n-gram pool, verified in the same pass"),
             {})]
