"""Logprobs in OpenAI's shapes: the engine's scored tokens (specdec.sampling.logprobs) as text.

The scheduler thread turns each scored token into a `Scored` (its text, its UTF-8 bytes, its logprob and
its top alternatives, each with text and bytes), decoding under the tokenizer lock; the app then writes
them as chat's `logprobs.content` or as completions' `{tokens, token_logprobs, top_logprobs, text_offset}`.
A token's text is its id decoded alone; its bytes are the bytes it stands for, also where they are only
part of a UTF-8 character (a byte-level vocabulary's token, or a `<0xNN>` byte token).
"""

from __future__ import annotations

import re
import threading
from typing import NamedTuple

from specdec.model.byte_bpe import byte_alphabet
from specdec.sampling.logprobs import TokenLogprob

BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class Scored(NamedTuple):
    """One token with its logprob (None: the prompt's first token) and its top alternatives."""

    token: str
    bytes: list[int]
    logprob: float | None
    top: tuple[tuple[str, list[int], float], ...] = ()


class TokenTexts:
    """Token id -> (text, bytes), kept per id; decodes under `lock` (the tokenizer is shared)."""

    def __init__(self, tokenizer, lock: threading.Lock | None = None):
        self.tokenizer = tokenizer
        self.lock = lock or threading.Lock()
        self._known: dict[int, tuple[str, list[int]]] = {}
        self._pieces: dict[int, str] | None = None
        self._bytes = {c: b for b, c in byte_alphabet().items()}  # a byte-level spelling -> bytes

    def of(self, token: int) -> tuple[str, list[int]]:
        if token not in self._known:
            with self.lock:
                text = self.tokenizer.decode([token])
            self._known[token] = (text, self._raw_bytes(token, text))
        return self._known[token]

    def _raw_bytes(self, token: int, text: str) -> list[int]:
        if "\ufffd" not in text:
            return list(text.encode("utf-8"))
        piece = self._piece(token)
        byte = BYTE_TOKEN.fullmatch(piece)
        if byte:
            return [int(byte.group(1), 16)]
        if piece and all(c in self._bytes for c in piece):
            return [self._bytes[c] for c in piece]
        return list(text.encode("utf-8"))

    def _piece(self, token: int) -> str:
        """The vocabulary's own spelling of a token ('' where unknown)."""
        if self._pieces is None:
            with self.lock:
                self._pieces = {i: s for s, i in self.tokenizer.get_vocab().items()}
        return self._pieces.get(token, "")

    def scored(self, lp: TokenLogprob | None, token: int | None = None) -> Scored:
        """A scored token as text; lp None: `token` without a logprob (the prompt's first)."""
        if lp is None:
            return Scored(*self.of(token), None)
        return Scored(*self.of(lp.token), lp.logprob, tuple((*self.of(t), v) for t, v in lp.top))


def chat_content(scored: list[Scored]) -> list[dict]:
    """Chat's `logprobs.content`: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]."""
    return [{"token": s.token, "logprob": s.logprob, "bytes": s.bytes,
             "top_logprobs": [{"token": t, "logprob": v, "bytes": b} for t, b, v in s.top]} for s in scored]


class CompletionLogprobs:
    """Completions' `logprobs` for a run of tokens: {tokens, token_logprobs, top_logprobs, text_offset};
    text_offset counts characters from the answer's start and goes on across a stream's chunks. As
    OpenAI's, each top_logprobs dict holds the chosen token too (up to n + 1 entries); the prompt's
    first token (echo) has null for both."""

    def __init__(self, offset: int = 0):
        self.offset = offset

    def shape(self, scored: list[Scored]) -> dict:
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for s in scored:
            out["tokens"].append(s.token)
            out["token_logprobs"].append(s.logprob)
            top = None if s.logprob is None else {t: v for t, _, v in s.top}
            if top is not None:
                top.setdefault(s.token, s.logprob)
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(s.token)
        return out
