"""Constrained output through llguidance: Grammars compiles specs for one tokenizer and vocabulary
(cached, least recently used out), Constraint is one sequence's grammar state: the allowed-token mask
now and along a draft, the tokens the grammar forces next, and commits that roll back exactly.

Stop ids are llguidance's end-of-sequence tokens, so a mask allows them exactly where the grammar may
end. The Constraint takes a stop id itself (llguidance's matcher never sees it) and is finished after
one; it also counts as finished where the grammar can take nothing but a stop id.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
from llguidance import LLMatcher

from specdec.constraints.spec import ConstraintSpec
from specdec.constraints.vocab import Vocabulary
from specdec.errors import SpecdecError


class Grammars:
    """The compiler for one tokenizer and one model vocabulary."""

    def __init__(self, vocab: Vocabulary, cache_size: int = 64):
        self.vocab = vocab
        self.cache_size = cache_size
        self.compiled: OrderedDict[str, LLMatcher] = OrderedDict()  # spec key -> matcher in its start state

    @classmethod
    def for_tokenizer(cls, tokenizer, vocab_size: int, stop_ids, cache_size: int = 64) -> "Grammars":
        """`tokenizer`: a ByteLevelTokenizer or transformers fast tokenizer; `vocab_size`: the model's
        logits rows (padded past the tokenizer's vocabulary, or fewer); `stop_ids`: the ids that end a
        sequence (EOS, end of turn). About a second for a 150k vocabulary: build it once."""
        return cls(Vocabulary.build(tokenizer, vocab_size, stop_ids), cache_size)

    def compile(self, spec: ConstraintSpec) -> LLMatcher:
        """The spec's matcher in its start state (shared: copy it before use)."""
        if spec.key in self.compiled:
            self.compiled.move_to_end(spec.key)
            return self.compiled[spec.key]
        try:
            matcher = LLMatcher(self.vocab.tokenizer, spec.grammar(), log_level=0)
        except ValueError as e:
            raise SpecdecError(f"the {spec.kind} constraint is not valid: {e}") from None
        if matcher.is_error():
            raise SpecdecError(f"the {spec.kind} constraint is not valid: {first_lines(matcher.get_error())}")
        self.compiled[spec.key] = matcher
        while len(self.compiled) > self.cache_size:
            self.compiled.popitem(last=False)
        return matcher

    def constraint(self, spec: ConstraintSpec) -> "Constraint":
        """A fresh grammar state for one sequence."""
        return Constraint(self.compile(spec).deep_copy(), self.vocab)


def first_lines(message: str, n: int = 4) -> str:
    return "\n".join(message.strip().splitlines()[:n])


class Constraint:
    """One sequence's grammar state."""

    def __init__(self, matcher: LLMatcher, vocab: Vocabulary):
        self.matcher = matcher
        self.vocab = vocab
        self.vocab_size = vocab.size
        self.ended = False  # a stop id was taken
        # masks met since the last advance, by the drafted tokens after the committed state: a drafter's
        # masks (mask_after) are its draft's verify rows (masks_along), computed once
        self.memo: dict[tuple[int, ...], torch.Tensor] = {}

    @property
    def finished(self) -> bool:
        """A stop id was taken, or the grammar can take nothing but a stop id."""
        return self.ended or self.matcher.is_stopped()

    def allowed(self) -> torch.Tensor:
        """bool [vocab_size]: the tokens the grammar allows now (all False once a stop id is taken)."""
        return self.mask_here(())

    def masks_along(self, tokens: list[int]) -> torch.Tensor:
        """bool [m + 1, vocab_size]: the mask now and after each of tokens[:m], m being how many
        leading tokens the grammar takes; the state is as before afterwards."""
        rows = [self.mask_here(())]
        was_ended, m = self.ended, 0
        for token in tokens:
            if not self.take(token):
                break
            m += 1
            rows.append(self.mask_here(tuple(tokens[:m])))
        self.undo(m, was_ended)
        return torch.stack(rows)

    def mask_after(self, drafted: list[int]) -> torch.Tensor | None:
        """bool [vocab_size]: what the grammar allows after `drafted`; None where it rejects a drafted
        token or allows nothing after them (as base.walk_masks, one mask computed); state unchanged."""
        mask = self.memo.get(tuple(drafted))
        if mask is None:
            mask = self._after(drafted, lambda: self.mask_here(tuple(drafted)))
        return mask if mask is not None and mask.any() else None

    def _after(self, drafted, fn):
        """fn() in the state after `drafted` (None where the grammar rejects one); the state is restored."""
        was_ended, taken = self.ended, 0
        while taken < len(drafted) and self.take(drafted[taken]):
            taken += 1
        try:
            return fn() if taken == len(drafted) else None
        finally:
            self.undo(taken, was_ended)

    def mask_here(self, key: tuple[int, ...]) -> torch.Tensor:
        """bool [vocab_size]: the mask of the current state, reached by `key` after the committed one."""
        mask = self.memo.get(key)
        if mask is None:
            bits = torch.zeros(1, self.vocab.words, dtype=torch.int32)  # [1, words]
            self.fill(bits[0])
            mask = self.memo[key] = self.unpack(bits)[0]
        return mask

    def tree_masks(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """bool [n + 1, vocab_size]: row 0 the mask now, row i + 1 the mask after node i's path
        (parents[i] < i, -1 for the root); all False where the grammar rejects a token on the path (as
        base.tree_masks, each node's mask computed once, depth first); state unchanged."""
        bits = torch.zeros(len(tokens) + 1, self.vocab.words, dtype=torch.int32)  # [n + 1, words]
        children: list[list[int]] = [[] for _ in range(len(tokens) + 1)]  # row -> the rows of its children
        for i, parent in enumerate(parents):
            children[parent + 1].append(i + 1)
        self.fill(bits[0])
        self.visit(0, tokens, children, bits)
        return self.unpack(bits)

    def visit(self, row: int, tokens: list[int], children: list[list[int]], bits: torch.Tensor) -> None:
        for child in children[row]:
            was_ended = self.ended
            if self.take(tokens[child - 1]):
                self.fill(bits[child])
                self.visit(child, tokens, children, bits)
                self.undo(1, was_ended)

    def advance(self, tokens: list[int]) -> None:
        """Commit `tokens`, all or none (SpecdecError naming the first one the grammar rejects)."""
        if tokens:
            self.memo.clear()
        was_ended = self.ended
        for i, token in enumerate(tokens):
            if not self.take(token):
                self.undo(i, was_ended)
                why = "the output is already finished" if self.finished else "the grammar rejects it"
                raise SpecdecError(f"token {token} (at {i} of {len(tokens)}) breaks the constraint: {why}")

    def forced(self, limit: int, after: list[int] | tuple = ()) -> list[int]:
        """Up to `limit` tokens the grammar forces after the committed tokens and `after` (drafted ones;
        [] where the grammar rejects them); the state is unchanged. llguidance's fast-forward tokens:
        the forced text in the tokenizer's own tokenization, short of a last token that the text
        after it could still merge into."""
        if limit <= 0 or self.finished:
            return []
        return self._after(after, lambda: [] if self.finished else self._forced_here(limit)) or []

    def _forced_here(self, limit: int) -> list[int]:
        tokens = self.matcher.compute_ff_tokens()[:limit]
        n = self.matcher.validate_tokens(tokens)
        bad = [i for i, t in enumerate(tokens[:n]) if not self.vocab.is_usable(t)]
        return tokens[:bad[0] if bad else n]

    def take(self, token: int) -> bool:
        """Take one token if the grammar allows it now; False (and no change) if not."""
        if self.ended:
            return False
        if token in self.vocab.stop_ids:
            self.ended = self.matcher.is_accepting()
            return self.ended
        return self.vocab.is_usable(token) and self.matcher.try_consume_tokens([token]) == 1

    def undo(self, taken: int, was_ended: bool) -> None:
        """Give back the last `taken` tokens take() took, the state having been `was_ended` before."""
        in_matcher = taken - int(self.ended and not was_ended)
        if in_matcher and not self.matcher.rollback(in_matcher):
            raise SpecdecError(f"the grammar engine could not roll back {in_matcher} tokens")
        self.ended = was_ended

    def fill(self, row: torch.Tensor) -> None:
        """The engine's bitmask of the current state into row [words] (int32, contiguous)."""
        if self.ended:
            row.zero_()
            return
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), self.vocab.words * 4)
        if self.matcher.is_error():
            raise SpecdecError(f"the grammar engine failed: {first_lines(self.matcher.get_error())}")

    def unpack(self, bits: torch.Tensor) -> torch.Tensor:
        """bits [n, words] int32 (bit j of word w: token 32 w + j) -> bool [n, vocab_size], the unusable
        ids cleared."""
        words = bits.numpy()
        words &= self.vocab.usable_bits
        return torch.from_numpy(np.unpackbits(words.view(np.uint8), axis=1, count=self.vocab_size,
                                              bitorder="little")).view(torch.bool)
