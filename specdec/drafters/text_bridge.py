"""Text between two tokenizers, as bytes: what drafting across tokenizers stands on.

Each token is the bytes it spells (`TokenText.pieces`), so a token history is exactly a byte string,
whichever tokenizer made it, and bytes that are no complete UTF-8 text (a byte-level piece, half of
a character) are still carried: the draft's own history encodes them as single-byte tokens. A
tokenizer whose tokens do not spell the text they encode (decode(encode(text)) != text on the
probe strings, or token bytes that do not add up to the text) cannot carry text between two
models losslessly and is refused. (A byte some byte-level vocabulary has no token for, such as a
control character, is left out of the draft's history: the draft only reads that history, and what
it proposes is matched against the committed text itself.)

`target_tokens` turns a draft's text into the target tokens to propose: the draft's bytes after the
committed text, re-tokenized by the target (joined to the last committed token where the two
tokenize alike), keeping only tokens whose end stays a token boundary whatever text follows (as far
as a few probe suffixes show), never a control token.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from functools import lru_cache

from specdec.errors import SpecdecError
from specdec.model.byte_bpe import byte_alphabet
from specdec.tokens import common_prefix

# Strings a tokenizer must round-trip: ASCII, code with indentation, Unicode, emoji, leading spaces
PROBES = ("Hello, world! It's 3:45 p.m.", "def f(x):\n    return x + 1\n\n\nclass A:\n\tpass\n",
          "  two leading spaces", " one leading space", "\n\nnewlines first", "tabs\tand\r\nCRLF\r\n",
          "héllo naïve café façade", "Привет, мир", "你好，世界。日本語のテキスト", "emoji 🎉👍🏽 and 🇫🇷!",
          "x=1;y=[2,3];z={'a':b}", "<b>tags</b> & \"quotes\"   trailing  ", "1234567890 3.14159 -0.5e10")
# Suffixes that test whether a token's end is a stable boundary: a letter, a digit, a space, a newline,
# punctuation (each a different class of the pre-tokenizers' splitting rules)
FOLLOWERS = ("a", "1", " ", "\n", ".")
NOT_TEXT = re.compile("([\udc80-\udcff])")  # a byte that is no UTF-8 text (Python's surrogateescape)


@dataclass(frozen=True)
class TokenText:
    """A tokenizer seen as bytes: each id's bytes, the plain ids of byte strings, its control ids."""

    tokenizer: object
    pieces: tuple[bytes, ...]  # id -> the bytes it spells (a control token: its string)
    ids_of: dict[bytes, int]  # the bytes of a plain token -> its (lowest) id
    control: frozenset[int]  # special tokens: never proposed, and a draft stops at one

    @classmethod
    def of(cls, tokenizer) -> "TokenText":
        pieces = token_pieces(tokenizer)
        special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        special |= {i for i in (tokenizer.eos_token_id, tokenizer.bos_token_id) if i is not None}
        ids_of: dict[bytes, int] = {}
        for i, piece in enumerate(pieces):
            if i not in special and piece:
                ids_of.setdefault(piece, i)
        return cls(tokenizer, pieces, ids_of, frozenset(special))

    def text_bytes(self, ids) -> bytes:
        return b"".join(self.pieces[i] for i in ids)

    def encode(self, text: str, specials: bool = False) -> list[int]:
        """specials: a special token's string in the text is that token (else it is plain text)."""
        if not text:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=not specials))

    def encode_bytes(self, data: bytes, specials: bool = False) -> list[int]:
        """Ids spelling exactly `data`: its text encoded, a byte that is no text as its byte's token."""
        ids: list[int] = []
        for run in NOT_TEXT.split(data.decode("utf-8", errors="surrogateescape")):
            if len(run) == 1 and NOT_TEXT.match(run):  # a byte no UTF-8 text holds may have no token: left out
                ids += [self.ids_of[b]] if (b := bytes([ord(run) - 0xDC00])) in self.ids_of else []
            else:
                ids += self.encode(run, specials)
        return ids

    def stable(self, text: str, ids: list[int]) -> int:
        """How many leading tokens of ids (= encode(text)) end where a token ends whatever follows."""
        n = len(ids)
        for follower in FOLLOWERS:
            n = min(n, common_prefix(ids, self.encode(text + follower)))
        return n


def token_pieces(tokenizer) -> tuple[bytes, ...]:
    """Each id's bytes: byte-level BPE pieces through GPT-2's byte alphabet, SentencePiece pieces
    with their '▁' as a space and '<0xNN>' byte tokens as that byte, added tokens as their string."""
    vocab = tokenizer.get_vocab()
    pieces = [b""] * (max(vocab.values()) + 1)
    added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
    to_byte = {c: b for b, c in byte_alphabet().items()}
    byte_level = sum(c in vocab for c in to_byte) >= 192  # GPT-2's byte alphabet (a vocabulary may lack a few)
    for s, i in vocab.items():
        if i in added:
            pieces[i] = added[i].encode()
        elif byte_level and all(c in to_byte for c in s):
            pieces[i] = bytes(to_byte[c] for c in s)
        elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", s):
            pieces[i] = bytes([int(s[3:5], 16)])
        else:
            pieces[i] = s.replace("\u2581", " ").encode()
    return tuple(pieces)


def check_lossless(text: TokenText, role: str) -> None:
    """role: 'draft' or 'target'. SpecdecError unless the tokenizer round-trips the probe strings and
    its tokens spell them."""
    hint = {"draft": "the draft's tokenizer differs from the target's and cannot carry text between them losslessly",
            "target": "the target's tokenizer cannot take text from a draft with another tokenizer losslessly"}[role]
    for s in PROBES:
        ids = text.encode(s)
        back = text.tokenizer.decode(ids)
        if back != s:
            raise SpecdecError(f"{hint}: {s!r} comes back from encode and decode as {back!r}; "
                               "use a draft model with the target's tokenizer or one that round-trips text")
        if text.text_bytes(ids) != s.encode():
            raise SpecdecError(f"{hint}: the bytes of its tokens for {s!r} spell {text.text_bytes(ids)!r}")


@dataclass(frozen=True)
class Bridge:
    """The target's and the draft's tokenizers as bytes, both checked lossless."""

    target: TokenText
    draft: TokenText
    draft_per_target: float  # draft tokens per target token over the probe strings (a cost hint)


@lru_cache(maxsize=4)
def bridge(target_tokenizer, draft_tokenizer) -> Bridge:
    """The bridge between two tokenizers (built once per pair: a server's slots share it), or a
    SpecdecError naming why text cannot cross it losslessly. It encodes with private copies of the
    tokenizers: an encode sets the tokenizer's special-token matching for its call, and a server
    encodes prompts with the target's on other threads."""
    target, draft = TokenText.of(copy.deepcopy(target_tokenizer)), TokenText.of(copy.deepcopy(draft_tokenizer))
    check_lossless(draft, "draft")
    check_lossless(target, "target")
    ratio = sum(len(draft.encode(s)) for s in PROBES) / sum(len(target.encode(s)) for s in PROBES)
    return Bridge(target, draft, ratio)


def incomplete_tail(data: bytes) -> tuple[int, int]:
    """(bytes of an unfinished UTF-8 character at the end of data, bytes it still needs)."""
    for j in range(1, min(4, len(data)) + 1):
        b = data[-j]
        if b & 0xC0 == 0x80:  # a continuation byte: look further back for the lead byte
            continue
        size = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return (j, size - j) if size > j else (0, 0)
    return 0, 0


def target_tokens(target: TokenText, committed: bytes, last: int | None, drafted: bytes, ended: bool,
                  settle: bool = True) -> list[int]:
    """The target tokens to propose after the committed text for the draft's text `drafted`.

    committed: the committed text's bytes; last: the last committed target token (None: none);
    ended: the draft ended there (its end of text), so the last token is as stable as the rest;
    settle: keep only tokens whose end is a stable boundary (False: a cheap count while drafting).
    An unfinished character at the committed end is finished first (with the target's token for its
    missing bytes, else its byte tokens); a character cut at the draft's end is left out, and the
    token before the cut with it."""
    head: list[int] = []
    _, need = incomplete_tail(committed)
    if need:
        if len(drafted) < need:
            return []
        rest = drafted[:need]
        head = [target.ids_of[rest]] if rest in target.ids_of else [target.ids_of.get(bytes([b]), -1) for b in rest]
        if -1 in head:
            return []
        drafted, last = drafted[need:], None
    text = drafted.decode("utf-8", errors="surrogateescape")
    cut = NOT_TEXT.search(text)
    text = text[:cut.start()] if cut else text
    base = _joinable(target, last) if last is not None else None
    ids = target.encode(base + text) if base else []
    if base and ids[:1] == [last]:
        ids = ids[1:]
    else:
        base, ids = "", target.encode(text)
    n = len(ids)
    if settle and not (ended and not cut):
        n = target.stable(base + text, ([last] if base else []) + ids) - (1 if base else 0)
    if cut:
        n = min(n, len(ids) - 1)
    out = head + ids[:max(n, 0)]
    bad = [i for i, t in enumerate(out) if t in target.control]
    return out[:bad[0]] if bad else out


def _joinable(target: TokenText, token: int) -> str:
    """The last committed token's text, to re-tokenize the draft's text joined to it ('' when it
    cannot join: a control token, or no complete text)."""
    if token in target.control:
        return ""
    try:
        return target.pieces[token].decode("utf-8")
    except UnicodeDecodeError:
        return ""
