"""A request's logit bias and repetition penalties on the target's logits, row by row along a draft.

Plain decoding penalises token i's logits by the text before it. A verify pass scores k + 1 rows at
once, and row j's text is the committed one plus the draft's first j tokens (in a tree: the path to
its node). Each row is penalised by its own text, so the row a kept token comes from is exactly the
row plain decoding would have drawn it from, and greedy and sampled output stay those of plain
decoding with the same settings. A drafter may draft from its own logits penalised the same way
(`Penalties.after`, DraftState.penalize: a draft model's and a head's host chains do), so that it
guesses what the penalised target keeps; rejection sampling is exact for any q the draft was drawn
from, so a drafter that does not (lookup, trees, a device chain) only loses acceptance where the
penalties bite.

Per row, in this order (config.SamplingParams names the fields):
  1. logit_bias: its value added to each listed token's logit;
  2. repetition_penalty r, over the prompt and the answer so far: a seen token's logit l becomes
     l / r where l > 0, l x r otherwise;
  3. presence and frequency penalties, over the answer so far: l - presence x [count > 0] -
     frequency x count.
With penalty_last_n n > 0 (llama.cpp's counting) 2 and 3 count the row's last n tokens of the prompt,
the answer and its path alike: a token is seen where its count there is above 0.
Only the tokens these touch are gathered and scattered (a few thousand at most), not the vocabulary.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec.config import SamplingParams
from specdec.errors import SpecdecError
from specdec.tree import DraftTree


class Penalties:
    """One sequence's bias and penalties over the tokens they touch (its columns: the biased ids, the
    prompt's where the repetition penalty counts it, and every token the answer or a draft has held),
    with the answer's count of each, kept up to date by `rows`. The columns live in tensors that grow
    by doubling, so a step writes only its new tokens."""

    def __init__(self, sampling: SamplingParams, prompt: list[int], vocab: int):
        for token, _ in sampling.logit_bias:
            if token >= vocab:
                raise SpecdecError(f"logit_bias names token {token}, but the vocabulary has {vocab} tokens")
        self.repetition = sampling.repetition_penalty
        self.presence, self.frequency = sampling.presence_penalty, sampling.frequency_penalty
        self.last_n = sampling.penalty_last_n
        self.prompt_tail = list(prompt[max(0, len(prompt) - self.last_n):]) if self.last_n else []
        bias = dict(sampling.logit_bias)
        seen = set(prompt) if self.repetition != 1.0 and not self.last_n else set()
        ids = sorted(set(bias) | seen)
        self.column = {t: i for i, t in enumerate(ids)}  # token id -> its column
        self.n = len(ids)
        room = max(64, 2 * self.n)
        self.ids = torch.zeros(room, dtype=torch.long)
        self.ids[:self.n] = torch.tensor(ids, dtype=torch.long)
        self.counts = torch.zeros(room)  # the answer's occurrences so far
        self.in_prompt = torch.zeros(room, dtype=torch.bool)
        self.in_prompt[:self.n] = torch.tensor([t in seen for t in ids], dtype=torch.bool)
        self.bias = torch.zeros(room)
        self.bias[:self.n] = torch.tensor([bias.get(t, 0.0) for t in ids])
        self.counted = 0  # how many of the answer's tokens `counts` holds

    def _col(self, token: int) -> int:
        col = self.column.get(token)
        if col is None:
            if self.n == self.ids.numel():  # full: double every column's room
                self.ids, self.counts, self.in_prompt, self.bias = (
                    torch.cat([t, torch.zeros_like(t)]) for t in (self.ids, self.counts, self.in_prompt, self.bias))
            col = self.column[token] = self.n
            self.ids[col] = token
            self.n += 1
        return col

    def rows(self, answer: list[int], paths: list[list[int]]) -> "PenaltyRows":
        """The penalties of rows whose text is `answer` (the tokens generated so far) followed by each
        path (row j: paths[j], the draft tokens before it)."""
        if self.last_n:
            return self._window_rows(answer, paths)
        new = [self._col(t) for t in answer[self.counted:]]
        if new:
            self.counts.index_put_((torch.tensor(new),), torch.ones(len(new)), accumulate=True)
        self.counted = len(answer)
        at = [(j, self._col(t)) for j, p in enumerate(paths) for t in p]  # row j's path: +1 at each token
        return self._rows(self.counts[:self.n].repeat(len(paths), 1), at)

    def _rows(self, counts: torch.Tensor, at: list[tuple[int, int]]) -> "PenaltyRows":
        """PenaltyRows of counts # [R, u] with one more at each (row, column) of `at`."""
        if at:
            rows, cols = torch.tensor(at).T
            counts.index_put_((rows, cols), torch.ones(len(at)), accumulate=True)
        n = self.n
        return PenaltyRows(self, self.ids[:n], counts, self.in_prompt[:n], self.bias[:n])  # [:n] never changes

    def _window_rows(self, answer: list[int], paths: list[list[int]]) -> "PenaltyRows":
        """rows() as llama.cpp counts: each row's counts over the last `last_n` tokens of its text."""
        n = self.last_n
        text = (self.prompt_tail + answer[max(0, len(answer) - n):])[-n:]
        at = [(j, self._col(t)) for j, p in enumerate(paths) for t in (text + p)[-n:]]
        return self._rows(torch.zeros(len(paths), self.n), at)

    def after(self, answer: list[int], logits: torch.Tensor, drafted: list[int]) -> torch.Tensor:
        """logits # [vocab] (a drafter's, in the target's ids) penalised as the target's row whose text is
        `answer` followed by `drafted`: the distribution a drafter drafts from to guess what the target keeps."""
        return self.rows(answer, [drafted]).apply(logits[None])[0]


class PenaltyRows(NamedTuple):
    """What Penalties.rows made for one verify pass: ids # [u] the tokens touched, counts # [R, u]
    each row's answer counts of them, in_prompt # [u], bias # [u]."""

    of: Penalties
    ids: torch.Tensor
    counts: torch.Tensor
    in_prompt: torch.Tensor
    bias: torch.Tensor

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits # [R, vocab] (R: the rows `paths` named) -> fp32 # [R, vocab], penalised."""
        if logits.shape[0] != self.counts.shape[0]:
            raise SpecdecError(f"penalties for {self.counts.shape[0]} rows met {logits.shape[0]} rows of logits")
        out = logits.float().clone()
        if self.ids.numel() == 0:
            return out
        device, p = out.device, self.of
        ids, counts = self.ids.to(device), self.counts.to(device)
        sub = out.index_select(1, ids) + self.bias.to(device)  # [R, u]
        if p.repetition != 1.0:
            seen = (counts > 0) | self.in_prompt.to(device)
            sub = torch.where(seen, torch.where(sub > 0, sub / p.repetition, sub * p.repetition), sub)
        sub = sub - p.frequency * counts - p.presence * (counts > 0).float()
        out[:, ids] = sub
        return out


class Rules(NamedTuple):
    """A draft's verify rows as the target scores them: the penalties, then the grammar's masks (bool
    # [R, vocab] or None). Passed where a bare mask tensor otherwise goes (sampling/verify.masked)."""

    penalties: PenaltyRows
    masks: torch.Tensor | None


def paths_of(draft: DraftTree) -> list[list[int]]:
    """Each verify row's draft tokens before it: [] for the root, then each node's path to itself."""
    tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
    paths: list[list[int]] = [[]]
    for i, parent in enumerate(parents):
        paths.append(paths[parent + 1] + [tokens[i]])
    return paths
