"""llama.cpp's infill sampler (the `infill` of llama-server's `samplers`, which llama.vscode and llama.vim
ask for): which of a row's candidates (its finite logits, after the cuts before it) stay.

As llama.cpp's, on the candidates' probabilities (a softmax of their logits), in the order of their
logits, highest first:
- where the end-of-generation tokens hold enough of the mass (3 x their mass x the candidates'
  count above the text's), only they stay;
- else a candidate whose text begins another's gives its mass to whichever of the two is the more
  likely, the other leaving (text tokens only: an end token's text is empty); the text candidates
  under 0.2 leave, and where none is left the row is the end token alone; of the rest, renormalised,
  the text candidates under 1 / (their count + 1) leave.
What stays keeps its logit: llama.cpp's last sampler draws from a softmax of the logits left, so the
mass moved between candidates decides only which stay. A mask of the logits, so it shapes the target's
p and a drafter's q alike, and speculation stays exact under it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

TEXT_FLOOR = 0.2  # llama.cpp's first threshold on the merged probabilities


@dataclass(frozen=True, eq=False)
class InfillVocab:
    """What the sampler reads of a vocabulary: the end-of-generation ids, the one a row falls back to
    where no text is left, and a token's text as bytes (b"" for special tokens, as llama.cpp reads them)."""

    eog: frozenset[int]
    end: int
    piece: Callable[[int], bytes]


def infill_mask(logits: torch.Tensor, vocab: InfillVocab) -> torch.Tensor:
    """logits # [..., vocab] -> same, -inf at the candidates the sampler drops (each row on its own; a row
    of one end token where it falls back). Reads values back."""
    out, fallen = _kept_rows(logits.reshape(-1, logits.shape[-1]), None, vocab)
    for r in fallen:
        out[r] = float("-inf")
        out[r, vocab.end] = 0.0
    return out.reshape(logits.shape)


def infill_values(values: torch.Tensor, ids: torch.Tensor, vocab: InfillVocab) -> torch.Tensor | None:
    """The same on part of the vocabulary: values # [..., n] the logits of the tokens ids # [..., n] (the
    k best), the rest of each row out already. None where a row falls back to the end token, which may
    lie outside them: the caller takes the whole vocabulary's path."""
    out, fallen = _kept_rows(values.reshape(-1, values.shape[-1]), ids.reshape(-1, ids.shape[-1]), vocab)
    return None if fallen else out.reshape(values.shape)


def _kept_rows(rows: torch.Tensor, ids: torch.Tensor | None, vocab: InfillVocab) -> tuple[torch.Tensor, list[int]]:
    """rows # [R, n] with -inf at the candidates each drops (ids # [R, n]: the entries' token ids; None: the
    entries are the vocabulary), and the rows that fall back to the end token (left as they were)."""
    out, fallen = rows.clone(), []
    for r in range(rows.shape[0]):
        cand = torch.isfinite(rows[r]).nonzero().flatten()
        if len(cand) == 0:
            continue
        keep = kept((cand if ids is None else ids[r, cand]).tolist(), rows[r, cand], vocab)
        if keep is None:
            fallen.append(r)
            continue
        out[r] = float("-inf")
        out[r, cand[keep]] = rows[r, cand[keep]]
    return out, fallen


def kept(tokens: list[int], values: torch.Tensor, vocab: InfillVocab) -> list[int] | None:
    """Which of the candidates (token ids and their logits # [n]) stay, as positions in `tokens`; None
    for the fallback to the end token."""
    order = values.double().argsort(descending=True, stable=True)
    positions = order.tolist()
    ids = [tokens[j] for j in positions]
    p = torch.softmax(values.double()[order], dim=0).tolist()
    eog = [i in vocab.eog for i in ids]
    p_eog = sum(q for q, e in zip(p, eog) if e)
    p_txt = sum(q for q, e in zip(p, eog) if not e)
    if 3 * p_eog * len(ids) > p_txt:
        return [j for j, e in zip(positions, eog) if e]
    pieces = [b"" if e else vocab.piece(i) for i, e in zip(ids, eog)]
    alive = [True] * len(ids)
    for i0, a in enumerate(pieces):
        if not a:
            continue
        for i1 in [j for j, b in enumerate(pieces) if j != i0 and b.startswith(a)]:  # i0's text begins i1's
            if not alive[i0]:
                break
            if not alive[i1]:
                continue
            dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
            p[dst] += p[src]
            p[src], alive[src] = 0.0, False
    stay = [j for j in range(len(ids)) if alive[j] and (eog[j] or p[j] >= TEXT_FLOOR)]
    texts = sum(not eog[j] for j in stay)
    if texts == 0:
        return None
    total = sum(p[j] for j in stay)
    floor = 1.0 / (texts + 1)
    return [positions[j] for j in stay if eog[j] or p[j] / total >= floor]
