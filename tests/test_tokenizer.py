"""The byte-level BPE tokenizer built from GGUF metadata against transformers' GGUF builder on the
same file: the same backend, the same ids, text and chat renderings."""

import json
import random
from pathlib import Path

import pytest

from specdec.model.byte_bpe import SPLITS, ByteLevelTokenizer, build_backend
from specdec.model.gguf_file import GGUFFile
from specdec.model.tokenizer import gguf_metadata, gguf_tokenizer

TEXTS = ["Hello world", "  def f(x):\n\treturn x**2  # ok\n\n", "日本語のテキスト 😀 ü ß", "don't I'LL 12345 3.14",
         "<|im_start|>user hi<|im_end|>\n<|endoftext|>", "\r\n\r\n   \t", "a" * 300]
CHATS = [[{"role": "user", "content": "hi"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": "hello"}, {"role": "user", "content": "Write `sorted()` in C."}]]


def real_ggufs():
    from specdec.model.registry import is_present
    names = ["smollm2-135m-instruct"] + [n for n in ("qwen2.5-coder-1.5b-instruct",) if is_present(n)]
    return [pytest.param(n, id=n) for n in names]


@pytest.fixture(scope="module", params=real_ggufs())
def pair(request):
    from specdec.model.registry import pull
    gguf = GGUFFile(Path(pull(request.param)))
    return gguf_tokenizer(gguf), gguf_tokenizer(gguf, transformers_only=True)


def source_text() -> list[str]:
    text = Path(__file__).read_text() + (Path(__file__).parents[1] / "specdec/engine/step.py").read_text()
    return [text[i:i + 400] for i in range(0, len(text), 1200)]


def test_byte_level_files_get_the_tokenizer_transformers_builds(pair):
    ours, hf = pair
    assert isinstance(ours, ByteLevelTokenizer)
    assert json.loads(ours.backend.to_str()) == json.loads(hf.backend_tokenizer.to_str())
    assert ours.get_vocab() == hf.get_vocab() and len(ours) == len(hf)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_ids", "chat_template"):
        assert getattr(ours, name) == getattr(hf, name), name


def test_ids_text_and_chats_are_the_same(pair):
    ours, hf = pair
    for text in TEXTS + source_text():
        for special in (True, False):
            assert ours.encode(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special)
    rng = random.Random(0)
    for _ in range(40):
        ids = [rng.randrange(len(hf)) for _ in range(24)] + [hf.eos_token_id]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    for chat in CHATS:
        for gen in (True, False):
            text = hf.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False)
            assert ours.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False) == text
            ids = hf.apply_chat_template(chat, add_generation_prompt=gen, tokenize=True)
            assert ours.apply_chat_template(chat, add_generation_prompt=gen) == list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.mark.parametrize("pre", sorted(SPLITS))
def test_every_pre_tokenizer_built_by_hand_matches_transformers(smollm2_path, pre):
    """SmolLM2's vocabulary under each `tokenizer.ggml.pre` value byte_bpe knows, with BOS/EOS added
    as a Llama 3 file asks: the same backend and ids as transformers' builder on that metadata."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    info, config = gguf_metadata(GGUFFile(smollm2_path))
    info = dict(info, pre_tokenizer_type=pre)
    config = dict(config, add_bos_token=True, add_eos_token=True)
    ours = ByteLevelTokenizer(build_backend(info), config)
    hf = PreTrainedTokenizerFast(tokenizer_object=convert_gguf_tokenizer("llama", info)[0], **config)
    assert json.loads(ours.backend.to_str())["pre_tokenizer"] == json.loads(hf.backend_tokenizer.to_str())["pre_tokenizer"]
    for text in TEXTS + source_text()[:4]:
        assert ours.encode(text) == hf.encode(text)


def test_another_tokenizer_kind_goes_to_transformers(smollm2_path):
    info, _ = gguf_metadata(GGUFFile(smollm2_path))
    assert build_backend(dict(info, pre_tokenizer_type="tekken")) is None
    assert build_backend(dict(info, tokenizer_type="llama")) is None


def test_a_chat_template_that_does_not_parse_is_a_clear_error(smollm2_path):
    from specdec.errors import SpecdecError
    info, config = gguf_metadata(GGUFFile(smollm2_path))
    tok = ByteLevelTokenizer(build_backend(info), dict(config, chat_template="{% for m in messages %}"))
    with pytest.raises(SpecdecError, match="does not parse"):
        tok.apply_chat_template(CHATS[0])
