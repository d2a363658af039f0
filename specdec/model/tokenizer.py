"""Tokenizer and chat template, from the same source as the weights.

A GGUF file carries its tokenizer as metadata (vocabulary, merges, special token ids, chat template).
A byte-level BPE one is built on the tokenizers library directly (byte_bpe); any other goes through
transformers' GGUF tokenizer builders. Either way it lives in memory, with nothing written to disk.
An HF directory's tokenizer files load through transformers as usual."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.model.byte_bpe import ByteLevelTokenizer, build_backend
from specdec.model.gguf_file import GGUFFile

END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>", "</s>",
               # a fill-in-the-middle answer's ends, as llama.cpp's: the padding, file and repository markers
               "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<fim_pad>", "<file_sep>")
# fill-in-the-middle control tokens, (prefix, suffix, middle) as each family spells them: Qwen2.5-Coder
# and CodeGemma, StarCoder (1 and 2), DeepSeek-Coder; laid out prefix first (PSM), as all of them train
FIM_SPELLINGS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
                 ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
                 ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"))
# the repository-level tokens (repository name, file separator) laid before a FIM prompt's other files
REPO_SPELLINGS = (("<|repo_name|>", "<|file_sep|>"), ("<reponame>", "<file_sep>"))  # Qwen2.5-Coder, StarCoder
MAX_VOCAB_SIZE_DIFFERENCE = 128  # as llama.cpp's draft compatibility check


# GGUF metadata key -> transformers' name for it, as transformers' GGUF tokenizer builders take them
GGUF_TOKENIZER_KEYS = {
    "tokenizer.ggml.model": "tokenizer_type", "tokenizer.ggml.pre": "pre_tokenizer_type",
    "tokenizer.ggml.tokens": "tokens", "tokenizer.ggml.scores": "scores", "tokenizer.ggml.token_type": "token_type",
    "tokenizer.ggml.merges": "merges", "tokenizer.ggml.precompiled_charsmap": "precompiled_charsmap",
    "tokenizer.ggml.bos_token_id": "bos_token_id", "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.unknown_token_id": "unk_token_id", "tokenizer.ggml.padding_token_id": "pad_token_id",
    "tokenizer.ggml.add_space_prefix": "add_prefix_space",
}
SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unk_token_id",
                  "pad_token": "pad_token_id"}


def load_tokenizer(source: Path, gguf=None):
    """The tokenizer of a model directory, or of a GGUF file (`gguf`: its parsed GGUFFile, if at hand)."""
    if Path(source).is_dir():
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(str(source))
    return gguf_tokenizer(gguf if gguf is not None else GGUFFile(Path(source)))


def gguf_metadata(gguf) -> tuple[dict, dict]:
    """A GGUFFile's tokenizer metadata under transformers' names, and the tokenizer config (chat
    template, add_bos/add_eos, special tokens)."""
    info = {name: gguf.get(key) for key, name in GGUF_TOKENIZER_KEYS.items() if key in gguf.metadata}
    if "tokens" not in info:
        raise SpecdecError(f"{gguf.path} carries no tokenizer (no tokenizer.ggml.tokens in its metadata)")
    for name in ("token_type", "scores"):
        if name in info:
            info[name] = info[name].tolist()
    config = {"chat_template": gguf.get("tokenizer.chat_template") or family_chat_template(gguf, info["tokens"]),
              "add_bos_token": bool(gguf.get("tokenizer.ggml.add_bos_token", info.get("tokenizer_type") == "llama")),
              "add_eos_token": bool(gguf.get("tokenizer.ggml.add_eos_token", False))}
    tokens = info["tokens"]
    for name, key in SPECIAL_TOKENS.items():
        token_id = info.get(key)
        config[name] = tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None
    return info, config


# Gemma's chat format (HF's gemma-3 "-it" template; a system message opens the first user turn), for a
# Gemma GGUF file that carries no template of its own (the base models' files) but has the turn tokens
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}")


def family_chat_template(gguf, tokens) -> str | None:
    """The chat template of the file's model family where the file has none: Gemma's, where its
    vocabulary has Gemma's turn tokens; else None."""
    arch = str(gguf.get("general.architecture", ""))
    if arch.startswith("gemma") and {"<start_of_turn>", "<end_of_turn>"} <= set(tokens[:1024]):
        return GEMMA_CHAT_TEMPLATE
    return None


def gguf_tokenizer(gguf, transformers_only: bool = False):
    """A tokenizer built from a GGUFFile's metadata, in memory: byte-level BPE files on the tokenizers
    library directly (byte_bpe), any other through transformers' GGUF tokenizer builders."""
    info, config = gguf_metadata(gguf)
    backend = None if transformers_only else build_backend(info)
    if backend is not None:
        return ByteLevelTokenizer(backend, config)
    from transformers import PreTrainedTokenizerFast
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    except ImportError:  # older transformers: its own (slower) GGUF path
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(str(gguf.path.parent), gguf_file=gguf.path.name)
    backend, extra = convert_gguf_tokenizer(gguf.get("general.architecture"), info)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    if not prompt:
        raise SpecdecError("the prompt is empty; give some text to continue")
    if not chat:
        return tokenizer.encode(prompt, add_special_tokens=True)
    return encode_messages(tokenizer, [{"role": "user", "content": prompt}])


def fim_ids(tokenizer) -> tuple[int, int, int] | None:
    """The tokenizer's fill-in-the-middle tokens (prefix, suffix, middle), found by their spelling
    (FIM_SPELLINGS), or None where it has none."""
    return spelled_ids(tokenizer, FIM_SPELLINGS)


def spelled_ids(tokenizer, spellings: tuple[tuple[str, ...], ...]) -> tuple[int, ...] | None:
    """The ids of the first of `spellings` (each a tuple of token strings) whose tokens the vocabulary
    holds all of, or None."""
    token_id = tokenizer.token_id if isinstance(tokenizer, ByteLevelTokenizer) else tokenizer.get_vocab().get
    for spelling in spellings:
        ids = tuple(token_id(t) for t in spelling)
        if all(i is not None for i in ids):
            return ids
    return None


def text_ids(tokenizer, s: str) -> list[int]:
    """Text encoded as text: a control token's string inside it is the characters it is; no BOS."""
    return list(tokenizer.encode(s, add_special_tokens=False, split_special_tokens=True)) if s else []


def lead_ids(tokenizer) -> list[int]:
    """What the tokenizer puts before a text of its own accord (a BOS, where it adds one)."""
    with_special, plain = list(tokenizer.encode("x", add_special_tokens=True)), text_ids(tokenizer, "x")
    return with_special[:next((i for i in range(len(with_special)) if with_special[i:i + len(plain)] == plain), 0)]


def encode_infill(tokenizer, prefix: str, suffix: str) -> list[int]:
    """The prompt that asks for the text between `prefix` and `suffix` (the middle): the model's
    fill-in-the-middle tokens around both, prefix first, as its training laid them out. Both are text:
    a control token's string inside them is encoded as the characters it is."""
    fim = fim_ids(tokenizer)
    if fim is None:
        raise SpecdecError("this model has no fill-in-the-middle tokens (such as <|fim_prefix|>, <|fim_suffix|> "
                           "and <|fim_middle|>), so it cannot fill a gap; use a code model trained for it, "
                           "or give the text before the gap alone")
    pre, suf, mid = fim
    return lead_ids(tokenizer) + [pre] + text_ids(tokenizer, prefix) + [suf] + text_ids(tokenizer, suffix) + [mid]


def encode_messages(tokenizer, messages: list[dict], tools: list[dict] | None = None,
                    continue_final: bool = False) -> list[int]:
    """A conversation through the model's chat template, ready for the assistant's reply (with the
    tools, OpenAI's function definitions, rendered as the template renders them, where given);
    continue_final: the last message is the assistant's reply begun (a prefill), rendered up to the end
    of its text, so that the answer goes on from there.

    Message content is text: a special token's string inside it (a forged `<|im_end|>`, say) is encoded
    as the characters it is, never as the control token; only the template places those. Content
    without such strings gives exactly the ids it always did: the rendered text, encoded whole."""
    if not tokenizer.chat_template:
        raise SpecdecError("this model has no chat template; drop --chat to use a plain prompt")
    controls = ControlTokens.of(tokenizer)
    marked = controls.mark(messages)
    more = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(marked or messages, add_generation_prompt=not continue_final, tokenize=False,
                                         continue_final_message=continue_final, **more)
    if marked is None:  # every special token in the text is the template's
        return list(tokenizer.encode(text, add_special_tokens=False))
    return controls.encode(tokenizer, text)


# While the template renders, a special token's string inside message content stands as MARK and one
# private-use character (the token's index in ControlTokens.strings); a MARK already there is doubled.
MARK = "\U0010FFFD"
INDEX_BASE = 0xF0000  # Supplementary Private Use Area-A: room for 65534 special tokens
UNMARK = re.compile(MARK + "(.)", re.S)


@lru_cache(maxsize=8)
def longest_first(strings: tuple[str, ...]) -> re.Pattern:
    """Any of `strings`, the longest first at a position (as the tokenizer matches its added tokens)."""
    return re.compile("|".join(map(re.escape, sorted(strings, key=len, reverse=True))) or "(?!)")


@dataclass(frozen=True)
class ControlTokens:
    """A tokenizer's special tokens: the control tokens a chat template places (turn markers, BOS/EOS).

    The text between them encodes on its own, with special-token matching off: what the tokenizer
    does to the whole text between its special tokens (it splits the text at them before any
    pre-tokenizing), except for a SentencePiece pre-tokenizer that marks only the string's start
    (prepend_scheme "first"), which sees a start at each piece."""

    strings: tuple[str, ...]  # index -> the token's string
    ids: dict[str, int]       # the token's string -> its id
    strip: dict[str, tuple[bool, bool]]  # the token's string -> (lstrip, rstrip): it eats the whitespace there

    @classmethod
    def of(cls, tokenizer) -> "ControlTokens":
        if MARK in (tokenizer.chat_template or ""):
            raise SpecdecError(f"the model's chat template holds the character {MARK!r}, which specdec reserves")
        special = {t.content: (i, (t.lstrip, t.rstrip))
                   for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        return cls(tuple(special), {s: i for s, (i, _) in special.items()}, {s: f for s, (_, f) in special.items()})

    @property
    def pattern(self) -> re.Pattern:
        return longest_first(self.strings)

    def mark(self, messages: list[dict]) -> list[dict] | None:
        """The messages with the special tokens' strings in their content marked (and every MARK
        doubled), or None when no content holds one."""
        if not any(isinstance(m.get("content"), str) and self.pattern.search(m["content"]) for m in messages):
            return None
        index = {s: MARK + chr(INDEX_BASE + i) for i, s in enumerate(self.strings)}

        def marked(content):
            if not isinstance(content, str):
                return content
            return self.pattern.sub(lambda m: index[m.group()], content.replace(MARK, MARK + MARK))
        return [{**m, "content": marked(m.get("content"))} if "content" in m else m for m in messages]

    def unmark(self, piece: str) -> str:
        def one(m: re.Match) -> str:
            if m.group(1) == MARK:
                return MARK
            i = ord(m.group(1)) - INDEX_BASE
            return self.strings[i] if 0 <= i < len(self.strings) else m.group()  # a mark the template cut
        return UNMARK.sub(one, piece)

    def encode(self, tokenizer, text: str) -> list[int]:
        """Ids of `text` rendered from marked messages: its special-token strings (all the template's)
        as their tokens, the text between them as plain text, each mark as the string it stands for.
        A token with lstrip/rstrip eats the whitespace beside it, as the tokenizer's own matching does."""
        ids: list[int] = []
        start, eat_start = 0, False
        for m in self.pattern.finditer(text):
            lstrip, rstrip = self.strip[m.group()]
            ids += self.plain(tokenizer, text[start:m.start()], eat_start, lstrip)
            ids.append(self.ids[m.group()])
            start, eat_start = m.end(), rstrip
        return ids + self.plain(tokenizer, text[start:], eat_start, False)

    def plain(self, tokenizer, piece: str, eat_start: bool, eat_end: bool) -> list[int]:
        piece = piece.lstrip() if eat_start else piece
        piece = self.unmark(piece.rstrip() if eat_end else piece)
        ids = list(tokenizer.encode(piece, add_special_tokens=False, split_special_tokens=True)) if piece else []
        found = set(ids) - {tokenizer.unk_token_id}  # an unknown word's token is no control token
        made = [s for s, i in self.ids.items() if i in found]
        if made:
            raise SpecdecError(f"this tokenizer makes the control token {made[0]!r} from plain text, so message "
                               "content cannot be kept apart from the chat template's own tokens")
        return ids


def eos_ids(tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    token_id = tokenizer.token_id if isinstance(tokenizer, ByteLevelTokenizer) else tokenizer.get_vocab().get
    return ids | {i for i in map(token_id, END_OF_TURN) if i is not None}


def check_compatible(target_tok, draft_tok) -> None:
    """Same token ids for the same strings, or a clear error (the pair cannot speculate)."""
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if abs(len(tv) - len(dv)) > MAX_VOCAB_SIZE_DIFFERENCE:
        raise SpecdecError(f"draft vocabulary ({len(dv)} tokens) does not match the target's ({len(tv)}); "
                           "use a draft model of the same family and tokenizer")
    by_id = {i: s for s, i in tv.items()}
    bad = [(s, i) for s, i in dv.items() if i in by_id and by_id[i] != s]
    if bad:
        s, i = bad[0]
        raise SpecdecError(f"draft and target tokenizers disagree ({len(bad)} ids differ, e.g. id {i} is "
                           f"{s!r} in the draft but {by_id[i]!r} in the target); use a draft of the same family")
