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
    of one end token where it falls back). Reads values back to the host."""
    rows = logits.reshape(-1, logits.shape[-1])
    out = rows.clone()
    for r in range(rows.shape[0]):
        keep = kept(rows[r], vocab)
        if keep is None:
            continue
        row = torch.full_like(rows[r], float("-inf"))
        if keep:
            row[keep] = rows[r, keep]
        else:
            row[vocab.end] = 0.0
        out[r] = row
    return out.reshape(logits.shape)


def kept(row: torch.Tensor, vocab: InfillVocab) -> list[int] | None:
    """The ids of row # [vocab] that stay ([] for the fallback to the end token); None where the row has
    no candidates."""
    cand = torch.isfinite(row).nonzero().flatten()
    if len(cand) == 0:
        return None
    values = row[cand].double()
    order = values.argsort(descending=True, stable=True)
    ids = cand[order].tolist()
    p = torch.softmax(values[order], dim=0).tolist()
    eog = [i in vocab.eog for i in ids]
    p_eog = sum(q for q, e in zip(p, eog) if e)
    p_txt = sum(q for q, e in zip(p, eog) if not e)
    if 3 * p_eog * len(ids) > p_txt:
        return [i for i, e in zip(ids, eog) if e]
    pieces = [b"" if e else vocab.piece(i) for i, e in zip(ids, eog)]
    alive = [True] * len(ids)
    for i0 in range(len(ids)):
        for i1 in range(len(ids)):
            if not alive[i0]:
                break
            if i0 == i1 or not alive[i1]:
                continue
            a, b = pieces[i0], pieces[i1]
            if a and len(a) <= len(b) and b.startswith(a):  # i0's text begins i1's
                dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
                p[dst] += p[src]
                p[src], alive[src] = 0.0, False
    stay = [j for j in range(len(ids)) if alive[j] and (eog[j] or p[j] >= TEXT_FLOOR)]
    texts = sum(not eog[j] for j in stay)
    if texts == 0:
        return []
    total = sum(p[j] for j in stay)
    floor = 1.0 / (texts + 1)
    return [ids[j] for j in stay if eog[j] or p[j] / total >= floor]
