"""Tokenizer and chat template, from the same source as the weights (via HF transformers)."""

from __future__ import annotations

from pathlib import Path

from specdec.errors import SpecdecError

END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "</s>")
MAX_VOCAB_SIZE_DIFFERENCE = 128  # as llama.cpp's draft compatibility check


def load_tokenizer(directory: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(directory))


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
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    vocab = tokenizer.get_vocab()
    return ids | {vocab[t] for t in END_OF_TURN if t in vocab}


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
