"""Tokenizer and chat template, from the same source as the weights.

A GGUF file carries its tokenizer as metadata (vocabulary, merges, special token ids, chat template).
A byte-level BPE one is built on the tokenizers library directly (byte_bpe); any other goes through
transformers' GGUF tokenizer builders. Either way it lives in memory, with nothing written to disk.
An HF directory's tokenizer files load through transformers as usual."""

from __future__ import annotations

from pathlib import Path

from specdec.errors import SpecdecError

END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "</s>")
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
    from specdec.model.gguf_file import GGUFFile
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
    config = {"chat_template": gguf.get("tokenizer.chat_template"),
              "add_bos_token": bool(gguf.get("tokenizer.ggml.add_bos_token", info.get("tokenizer_type") == "llama")),
              "add_eos_token": bool(gguf.get("tokenizer.ggml.add_eos_token", False))}
    tokens = info["tokens"]
    for name, key in SPECIAL_TOKENS.items():
        token_id = info.get(key)
        config[name] = tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None
    return info, config


def gguf_tokenizer(gguf, transformers_only: bool = False):
    """A tokenizer built from a GGUFFile's metadata, in memory: byte-level BPE files on the tokenizers
    library directly (byte_bpe), any other through transformers' GGUF tokenizer builders."""
    info, config = gguf_metadata(gguf)
    from specdec.model.byte_bpe import ByteLevelTokenizer, build_backend
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


def encode_messages(tokenizer, messages: list[dict]) -> list[int]:
    """A conversation through the model's chat template, ready for the assistant's reply."""
    if not tokenizer.chat_template:
        raise SpecdecError("this model has no chat template; drop --chat to use a plain prompt")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def eos_ids(tokenizer) -> set[int]:
    from specdec.model.byte_bpe import ByteLevelTokenizer
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
