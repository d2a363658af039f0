"""A tokenizer as the grammar engine sees it: llguidance's LLTokenizer built from the tokenizers
library's own description (any fast tokenizer: byte-level BPE, SentencePiece, byte fallback), and the
ids no output may hold: llama.cpp's padding entries and rows past the tokenizer's vocabulary."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass

import llguidance
import numpy as np
import torch

from specdec.errors import SpecdecError

PADDING = re.compile(r"\[PAD(\d+)\]")  # llama.cpp's converter fills ids the HF vocabulary lacks with "[PAD<id>]"


@dataclass(frozen=True)
class Vocabulary:
    """What every constraint over one tokenizer and one model vocabulary shares (read only)."""

    tokenizer: llguidance.LLTokenizer
    size: int                  # the model's vocabulary: its logits' rows
    stop_ids: frozenset[int]
    usable: torch.Tensor       # [size] bool: ids an output may hold
    usable_bits: np.ndarray    # [words] int32: `usable` in llguidance's bitmask layout

    @classmethod
    def build(cls, tokenizer, size: int, stop_ids) -> "Vocabulary":
        backend = backend_of(tokenizer)
        stops = sorted(set(stop_ids))
        if not stops or not all(0 <= s < size for s in stops):
            raise SpecdecError(f"constrained output needs stop ids within the vocabulary of {size}, not {stops}")
        usable = usable_ids(backend, size)
        usable[stops] = True
        n_vocab = max(size, backend.get_vocab_size(with_added_tokens=True))
        return cls(engine_tokenizer(backend, n_vocab, stops), size, frozenset(stops), usable,
                   pack_bits(usable, (n_vocab + 31) // 32))

    @property
    def words(self) -> int:
        """32-bit words in one engine bitmask."""
        return len(self.usable_bits)

    def is_usable(self, token: int) -> bool:
        return 0 <= token < self.size and bool(self.usable[token])

    def term(self, text: str) -> str:
        """`text` as a term of a Lark grammar: the one token the engine reads it as, by its id, where that
        token is special to the engine (an added token such as Qwen2.5's `<tool_call>`): a quoted literal
        of such a token's text lets the token through the engine's mask and then refuses it when taken.
        Else the text, quoted."""
        ids = self.tokenizer.tokenize_str(text)
        if len(ids) == 1 and self.tokenizer.is_special_token(ids[0]):
            return f"<[{ids[0]}]>"
        return json.dumps(text)


def backend_of(tokenizer):
    """The tokenizers.Tokenizer under a ByteLevelTokenizer or a transformers fast tokenizer."""
    # ByteLevelTokenizer.backend; transformers' backend_tokenizer (whose `backend` is a name in 5.x)
    candidates = (getattr(tokenizer, "backend", None), getattr(tokenizer, "backend_tokenizer", None))
    backend = next((c for c in candidates if hasattr(c, "to_str")), None)
    if backend is None:
        raise SpecdecError(f"constrained output needs a fast (tokenizers-backed) tokenizer, not "
                           f"{type(tokenizer).__name__}")
    return backend


def engine_tokenizer(backend, n_vocab: int, stop_ids: list[int]) -> llguidance.LLTokenizer:
    """llguidance's tokenizer over `n_vocab` ids, the stop ids as its end-of-sequence tokens (about a
    second for a 150k vocabulary: build it once per tokenizer)."""
    plain = copy.copy(backend)
    plain.no_padding()
    plain.no_truncation()
    try:
        return llguidance.LLTokenizer(plain.to_str(), n_vocab=n_vocab, eos_token=stop_ids)
    except ValueError as e:
        raise SpecdecError(f"the grammar engine cannot use this tokenizer: {e}") from None


def padding_ids(backend) -> list[int]:
    """The vocabulary's "[PAD<id>]" entries: no text, never generated."""
    return [i for piece, i in backend.get_vocab(with_added_tokens=False).items()
            if (m := PADDING.fullmatch(piece)) and int(m.group(1)) == i]


def usable_ids(backend, size: int) -> torch.Tensor:
    """bool [size]: the ids an output may hold (the tokenizer's, less its padding entries)."""
    usable = torch.zeros(size, dtype=torch.bool)  # [size]
    usable[:min(size, backend.get_vocab_size(with_added_tokens=True))] = True
    usable[[i for i in padding_ids(backend) if i < size]] = False
    return usable


def pack_bits(mask: torch.Tensor, words: int) -> np.ndarray:
    """bool [n <= 32 words] -> int32 [words], bit j of word w standing for id 32 w + j (llguidance's layout)."""
    padded = np.zeros(words * 32, dtype=np.uint8)
    padded[:len(mask)] = mask.numpy()
    return np.packbits(padded, bitorder="little").view(np.int32)
