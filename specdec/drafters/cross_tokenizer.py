"""A draft model with another tokenizer: it drafts its own tokens, their text is re-tokenized for
the target, and only target tokens are proposed (so only target tokens are verified).

The draft keeps its own token history: its tokenization of the committed text (prompt and accepted
target tokens), kept in step as the text grows. After a verification it keeps the longest prefix of
its tokens (the ones it drafted included) whose bytes begin the committed text, re-tokenizes only
the tail after that (with its last kept token, which the new text may merge into), and its KV cache
is cut to what it keeps (the draft-model drafter's cache handling, on the draft's own ids).

A step drafts greedily until the drafted text holds k target tokens whose ends are stable token
boundaries (or k + a few draft tokens), stopping at a draft control token (its end of turn). The
proposal is a deterministic function of the committed text, so it is verified with q one-hot
(`DraftTree.q = None`, as prompt lookup): greedy output is plain decoding's, and at T > 0 the
target's distribution is kept exactly. See text_bridge for the seams (byte-level pieces, a
character cut in two, a word cut at the draft's end, control tokens).
"""

from __future__ import annotations

import math

import torch

from specdec.drafters.base import END, BaseDrafter, Capabilities, DraftState
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.text_bridge import Bridge, bridge, target_tokens
from specdec.errors import SpecdecError
from specdec.model.tokenizer import check_compatible
from specdec.model.transformer import Transformer
from specdec.tree import DraftTree


class CrossTokenizerDrafter(BaseDrafter):
    """bridge: the two tokenizers as bytes (text_bridge.bridge); model: the draft model (its
    tokenizer is bridge.draft); capacity: the draft's cache in its own tokens; head_rows, p_min,
    window: as DraftModelDrafter's (the draft scores ids < head_rows; a step ends where its top
    probability falls below p_min; the draft reads only the prompt's last `window` draft tokens)."""

    caps = Capabilities()  # chains of target tokens, one sequence at a time, verified by the engine

    def __init__(self, bridge: Bridge, model: Transformer, capacity: int, head_rows: int = 0, p_min: float = 0.0,
                 window: int = 0):
        self.bridge = bridge
        vocab = model.config.vocab_size
        self.inner = DraftModelDrafter(model, vocab, capacity, head_rows, p_min, None, window)
        self.model = self.inner.model  # what a draft step runs (the policy times it)
        self.draft_per_target = bridge.draft_per_target
        self.bos = start_token(bridge.draft.tokenizer)  # the draft's own start token: read as no text
        self.target_bos = start_token(bridge.target.tokenizer)
        self.start([])

    def prefill_tokens(self, prompt_len: int) -> int:
        return self.inner.prefill_tokens(round(prompt_len * self.draft_per_target))

    def cost_model(self):
        return self.model

    def adjust_costs(self, costs, target, measured: bool) -> None:
        costs.draft_cost *= self.draft_per_target  # a target token costs this many of the draft's own tokens

    def start(self, prompt: list[int]) -> None:
        self.committed = list(prompt)  # target tokens whose text the draft history spells
        skip = len(self.target_bos) if prompt[:len(self.target_bos)] == self.target_bos else 0  # no text either
        self.text = bytearray(self.bridge.target.text_bytes(prompt[skip:]))  # their bytes
        self.history = self.bos + self.bridge.draft.encode_bytes(bytes(self.text), specials=True)
        self.drafted: list[int] = []  # the last proposal's draft tokens (the last of them not fed)
        self.inner.start(self.history)

    def propose(self, state: DraftState) -> DraftTree:
        if state.k < 1:
            return DraftTree.empty()
        kept = self._catch_up(state.tokens)
        budget = math.ceil((state.k + 1) * max(1.0, self.draft_per_target)) + 1  # draft tokens, at most
        if len(self.history) - self.inner.offset + budget + 1 > self.inner.cache.capacity:
            return DraftTree.empty()  # the draft's cache is full: plain steps from here
        # the history past `kept` may have changed (the cache's committed count is past the window's offset)
        self.inner.committed = min(self.inner.committed, max(0, kept - self.inner.offset))
        feed = self.inner._sync(self.history)
        return DraftTree.chain(torch.tensor(self._draft(feed, state, budget), dtype=torch.long))

    def _draft(self, feed: list[int], state: DraftState, budget: int) -> list[int]:
        """Draft tokens one at a time until k stable target tokens are in their text; those tokens."""
        device = self.inner.cache.k.device
        x, data, ended, fed_all = torch.tensor([feed], device=device), b"", False, False
        last = self.committed[-1] if self.committed else None
        plain = DraftState(state.tokens, state.k, state.sampling, None)  # no confidence rule: p_min alone
        proposal: list[int] = []
        for i in range(budget):
            logits = self.inner._logits(x)  # [draft_vocab]
            token = int(logits.argmax())
            if token in self.bridge.draft.control or self.inner._decide(logits, None, plain, i) == END:
                ended, fed_all = token in self.bridge.draft.control, True
                break
            self.drafted.append(token)
            data += self.bridge.draft.pieces[token]
            rough = target_tokens(self.bridge.target, self.text, last, data, False, settle=False)
            if len(rough) > state.k:
                proposal = target_tokens(self.bridge.target, self.text, last, data, False)
                if len(proposal) >= state.k:
                    break
            x = torch.tensor([[token]], device=device)
        self.inner.cached += self.drafted if fed_all else self.drafted[:-1]
        if len(proposal) < state.k:
            proposal = target_tokens(self.bridge.target, self.text, last, data, ended)
        return proposal[:state.k]

    def _catch_up(self, tokens: list[int]) -> int:
        """The draft history spells the committed text again: the draft tokens that still begin it
        are kept, the rest of the text is re-tokenized from the last kept token on. Returns how many
        of the history's tokens are unchanged."""
        n = len(self.committed)
        if len(tokens) < n or (n and tokens[n - 1] != self.committed[-1]):
            raise SpecdecError("the committed tokens changed under the drafter; start() a new sequence")
        done = len(self.text)
        self.text += self.bridge.target.text_bytes(tokens[n:])
        self.committed += tokens[n:]
        history, pos = self.history, done
        for token in self.drafted:
            piece = self.bridge.draft.pieces[token]
            if not self.text.startswith(piece, pos):
                break
            history.append(token)
            pos += len(piece)
        self.drafted = []
        if pos == len(self.text):
            return len(history)
        keep = len(history)
        piece = self.bridge.draft.pieces[history[-1]] if history else b""
        if (keep > max(len(self.bos), self.inner.offset + 1) and history[-1] not in self.bridge.draft.control
                and self.text.endswith(piece, 0, pos)):
            keep, pos = keep - 1, pos - len(piece)  # the last kept token may merge with the text after it
        tail = self.bridge.draft.encode_bytes(bytes(self.text[pos:]), specials=True)
        if keep < len(history) and tail[:1] == [history[keep]]:
            keep, tail = keep + 1, tail[1:]
        self.history = history[:keep] + tail
        return keep


def start_token(tokenizer) -> list[int]:
    """[the BOS id] when the tokenizer starts every text with it, else []."""
    bos = tokenizer.bos_token_id if getattr(tokenizer, "add_bos_token", False) else None
    return [bos] if bos is not None else []


def same_tokenizer(target_tok, draft_tok) -> bool:
    """The draft's ids are the target's (check_compatible passes)."""
    if target_tok is draft_tok:  # one tokenizer, taken by the draft from the target's identical file metadata
        return True
    try:
        check_compatible(target_tok, draft_tok)
    except SpecdecError:
        return False
    return True


def model_drafter(target, draft, capacity: int, options, note=None) -> BaseDrafter:
    """The draft model's drafter (options: registry.DraftOptions): a DraftModelDrafter when the two
    share a tokenizer, else a CrossTokenizerDrafter (chains only), which `note` (a one-line log, or
    None) says."""
    if same_tokenizer(target.tokenizer, draft.tokenizer):
        return DraftModelDrafter(draft.module, target.module.config.vocab_size, capacity, options.draft_vocab,
                                 options.p_min, options.tree, options.window)
    if options.tree is not None:
        raise SpecdecError(f"{draft.name} has another tokenizer than {target.name}: it drafts chains across "
                           "tokenizers, not trees; drop --tree-budget / --tree-choices or use a draft of the same "
                           "family")
    pair = bridge(target.tokenizer, draft.tokenizer)
    if note:
        note(f"drafting across tokenizers: {draft.name}'s text is re-tokenized for {target.name} "
             f"({pair.draft_per_target:.2f} draft tokens per target token on the probe text)")
    return CrossTokenizerDrafter(pair, draft.module, capacity, options.draft_vocab, options.p_min, options.window)


def build_draft(parts, options, note):
    """The draft model's drafter (model_drafter), across tokenizers where the two differ."""
    if parts.draft is None:
        raise SpecdecError("this drafting method needs a draft model (--draft MODEL)")
    return model_drafter(parts.target, parts.draft, parts.capacity, options, note)
