"""A byte-level BPE tokenizer (GGUF `tokenizer.ggml.model == "gpt2"`: Qwen2, SmolLM2, Llama 3 ...)
built straight from the file's metadata on the `tokenizers` library, and chat templates rendered with
jinja2, without importing transformers (whose import and GGUF converter take about 2-3 s here).

It builds the same tokenizer transformers' GGUF converter does for these files (a test compares the
two on the same metadata); metadata it does not know (another pre-tokenizer) returns None, and the
caller falls back to transformers.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache

from specdec.errors import SpecdecError

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types

# The pre-tokenizer split of each `tokenizer.ggml.pre` we build by hand (None: GPT-2's own regex,
# inside ByteLevel). Any other value goes to transformers.
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2, "llama3": _LLAMA3, "llama-v3": _LLAMA3,
          "llama-bpe": _LLAMA3, "smollm": None, "gpt2": None, "default": None}


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = dict(zip(printable, map(chr, printable))), 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


def build_backend(info: dict):
    """A tokenizers.Tokenizer from GGUF tokenizer metadata (transformers' key names, see
    tokenizer.GGUF_TOKENIZER_KEYS), or None if this is not a byte-level BPE we build by hand."""
    pre = info.get("pre_tokenizer_type", "default")
    if info.get("tokenizer_type") != "gpt2" or pre not in SPLITS or "merges" not in info:
        return None
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    foreign = re.compile("[^" + re.escape("".join(sorted(alphabet))) + "]").search  # a char outside the alphabet
    tokens = info["tokens"]
    vocab = {(t if not foreign(t) else "".join(spelling[b] for b in t.encode("utf-8"))): i
             for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in info["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False))
    split = SPLITS[pre]
    tok.pre_tokenizer = (pre_tokenizers.ByteLevel(add_prefix_space=False) if split is None else
                         pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="$A", pair="$A:0 $B:1", special_tokens=[])
    types = list(info.get("token_type") or ())
    control = [t for t, kind in zip(tokens, types) if kind == CONTROL and not foreign(t)]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user = [t for t, kind in zip(tokens, types) if kind == USER_DEFINED and t in vocab]
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    return tok


class ByteLevelTokenizer:
    """The part of a transformers tokenizer's surface the engine uses: encode, decode, get_vocab,
    the special tokens, added_tokens_decoder and apply_chat_template."""

    def __init__(self, backend, config: dict):
        self.backend = backend
        self.chat_template = config.get("chat_template")
        self.add_bos_token, self.add_eos_token = config.get("add_bos_token", False), config.get("add_eos_token", False)
        self.special = {k: config.get(k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        self._vocab = None
        for name, token in self.special.items():
            setattr(self, name, token)
            setattr(self, f"{name}_id", backend.token_to_id(token) if token is not None else None)
        ids = [getattr(self, f"{n}_id") for n in self.special]
        self.all_special_ids = [i for j, i in enumerate(ids) if i is not None and i not in ids[:j]]
        self._template = None

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        """The id of a token of the vocabulary (added tokens included), None for a string that is none."""
        return self.backend.token_to_id(token)

    def get_vocab(self) -> dict[str, int]:
        if self._vocab is None:
            self._vocab = self.backend.get_vocab(with_added_tokens=True)
        return dict(self._vocab)

    @property
    def added_tokens_decoder(self) -> dict:
        """{id: AddedToken} of the added tokens; the control ones are `special` (as transformers')."""
        return self.backend.get_added_tokens_decoder()

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False) -> list[int]:
        """split_special_tokens: a special token's string in `text` is encoded as the text it is (as
        transformers' flag; set on the backend for each call, as transformers does)."""
        self.backend.encode_special_tokens = split_special_tokens
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            ids = ([self.bos_token_id] if self.add_bos_token and self.bos_token_id is not None else []) + ids + (
                [self.eos_token_id] if self.add_eos_token and self.eos_token_id is not None else [])
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False, tokenize: bool = True,
                            continue_final_message: bool = False, **kwargs):
        """As transformers' (continue_final_message: the text ends where the last message's text does)."""
        if not self.chat_template:
            raise SpecdecError("this model has no chat template")
        if self._template is None or self._template[0] != self.chat_template:  # compiled once per template text
            self._template = (self.chat_template, compile_template(self.chat_template))
        text = self._template[1].render(**{"messages": messages, "tools": None, "documents": None,
                                        "add_generation_prompt": add_generation_prompt,
                                        **{k: v for k, v in self.special.items() if v is not None}, **kwargs})
        if continue_final_message:
            text = up_to_final(text, messages[-1]["content"])
        return self.encode(text, add_special_tokens=False) if tokenize else text


def up_to_final(rendered: str, final: str) -> str:
    """A rendered conversation cut after its last message's text, as transformers' continue_final_message
    cuts it: after the text as given where the template kept it whole, else after it stripped."""
    if not isinstance(final, str) or not final.strip() or final.strip() not in rendered:
        raise SpecdecError("the chat template does not render the last message's text as given, so the answer "
                           "cannot go on from it")
    at = rendered.rindex(final.strip())
    if rendered[at:at + len(final.lstrip())] == final:
        return rendered[:at + len(final.lstrip())]
    return rendered[:at + len(final.strip())]


def compile_template(source: str):
    """A chat template in the environment transformers renders them in (sandboxed, trim_blocks,
    lstrip_blocks, loop controls, tojson without HTML escapes, raise_exception, strftime_now)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise SpecdecError(f"the model's chat template does not parse: {e}") from None
