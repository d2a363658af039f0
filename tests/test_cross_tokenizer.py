"""A draft model with another tokenizer: its text re-tokenized for the target. Greedy output equals
plain decoding's, sampling keeps the target's distribution, the seams between the two tokenizations
(a word cut at the draft's end, a character cut in two, a draft token over two target tokens,
control tokens), the draft's history after rejections, and the refusal of a lossy tokenizer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specdec.config import GenerationConfig, SamplingParams
from specdec.drafters.base import DraftState, NoDrafter
from specdec.drafters.cross_tokenizer import CrossTokenizerDrafter
from specdec.drafters.text_bridge import PROBES, Bridge, TokenText, bridge, incomplete_tail, target_tokens
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from specdec.model.registry import is_present
from tests.conftest import make_drafter, tiny_model
from tests.test_engine import N_TRIALS, SMALL_VOCAB, exact_joint, tv, tv_bound

TARGET, DRAFT = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"
needs_models = pytest.mark.skipif(not (is_present(TARGET) and is_present(DRAFT)),
                                  reason=f"needs {TARGET} and {DRAFT} installed (specdec pull)")


@pytest.fixture
def one_thread():
    """Tiny models are all per-call overhead: one intra-op thread is as fast and leaves the other core idle."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class ToyTokenizer:
    """Greedy longest match over `pieces` (characters without a piece are skipped); `specials` are
    control tokens after them; lower: it lowercases the text (a lossy tokenizer)."""

    def __init__(self, pieces: list[str], specials: list[str] = (), lower: bool = False):
        self.pieces, self.lower = list(pieces) + list(specials), lower
        self.specials = {len(pieces) + i: s for i, s in enumerate(specials)}
        self.eos_token_id = len(pieces) if specials else None
        self.bos_token_id = None

    def get_vocab(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.pieces)}

    @property
    def added_tokens_decoder(self) -> dict:
        return {i: SimpleNamespace(content=s, special=True) for i, s in self.specials.items()}

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False) -> list[int]:
        text = text.lower() if self.lower else text
        usable = [(p, i) for i, p in enumerate(self.pieces) if not (split_special_tokens and i in self.specials)]
        ids, pos = [], 0
        while pos < len(text):
            best = max(((p, i) for p, i in usable if text.startswith(p, pos)), key=lambda m: len(m[0]), default=None)
            if best is None:
                pos += 1
                continue
            ids.append(best[1])
            pos += len(best[0])
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(self.pieces[i] for i in ids)


# ---- the lossless check ----

def test_a_tokenizer_that_loses_text_is_refused_with_the_reason():
    everything = ToyTokenizer(sorted(set("".join(PROBES))))  # a piece for every character of the probes
    assert bridge(everything, everything).draft_per_target == 1.0
    lowercasing = ToyTokenizer(sorted(set("".join(PROBES))), lower=True)
    with pytest.raises(SpecdecError, match="draft's tokenizer differs from the target's and cannot carry text "
                                           "between them losslessly: .*Hello.* comes back from encode and decode "
                                           "as .*hello"):
        bridge(everything, lowercasing)
    ascii_only = ToyTokenizer([chr(c) for c in range(32, 127)] + ["\n", "\t", "\r"])  # drops the rest
    with pytest.raises(SpecdecError, match="target.s tokenizer cannot take text .* losslessly: .*naïve.* comes back "
                                           ".* as .hllo nave"):
        bridge(ascii_only, everything)


@needs_models
def test_the_real_pair_crosses_losslessly(tokenizers):
    target, draft = tokenizers
    pair = bridge(target, draft)
    assert 1.0 < pair.draft_per_target < 2.0  # SmolLM2 spends a few more tokens than Qwen2.5 on the probes
    for s in ["déjà vu 🎉", "\tx  = 1\n", "<|im_end|>"]:
        assert pair.draft.text_bytes(pair.draft.encode_bytes(s.encode())) == s.encode()
    cut = "🎉".encode()[:3] + b"\xff"  # a cut emoji and a byte no UTF-8 text holds
    assert pair.target.text_bytes(pair.target.encode_bytes(cut)) == cut


# ---- the seams, with both real tokenizers ----

@pytest.fixture(scope="module")
def tokenizers():
    if not (is_present(TARGET) and is_present(DRAFT)):
        pytest.skip(f"needs {TARGET} and {DRAFT} installed")
    from specdec.model.registry import model_path
    from specdec.model.tokenizer import load_tokenizer
    return load_tokenizer(model_path(TARGET)), load_tokenizer(model_path(DRAFT))


@pytest.fixture(scope="module")
def pair(tokenizers) -> Bridge:
    return bridge(*tokenizers)


def spelled(pair: Bridge, ids: list[int]) -> bytes:
    return pair.target.text_bytes(ids)


def test_a_word_cut_at_the_draft_s_end_is_not_proposed(pair):
    committed = b"def area(r):\n"
    last = pair.target.encode(committed.decode())[-1]
    drafted = b"    return self.compu"
    settled = target_tokens(pair.target, committed, last, drafted, ended=False)
    assert drafted.startswith(spelled(pair, settled)) and b"comp" not in spelled(pair, settled)
    assert spelled(pair, settled) == b"    return self"  # up to the cut word (Qwen2.5 spells ".com" as one token)
    whole = target_tokens(pair.target, committed, last, drafted, ended=True)  # the draft ended: all of it
    assert spelled(pair, whole) == drafted
    # the draft's text joins the last committed token where the two tokenize alike, else starts afresh
    assert target_tokens(pair.target, b"x = ", pair.target.encode("x = ")[-1], b"1\n", ended=True) == \
        pair.target.encode("1\n")


def test_a_character_cut_in_two_is_finished_or_left_out(pair):
    emoji = "🎉".encode()
    assert incomplete_tail(b"a" + emoji[:2]) == (2, 2) and incomplete_tail(b"a" + emoji) == (0, 0)
    # the draft's text ends inside a character: neither it nor the token before it is proposed
    ids = target_tokens(pair.target, b"x = 1\n", None, b"print('caf" + "é".encode()[:1], ended=True)
    assert spelled(pair, ids) in (b"print('", b"print(")
    # the committed text ends inside a character (a byte-level target token): the draft finishes it
    committed = b"s = '" + emoji[:2]
    ids = target_tokens(pair.target, committed, None, emoji[2:] + b"' + t\n", ended=True)
    assert spelled(pair, ids) == emoji[2:] + b"' + t\n"
    assert (committed + spelled(pair, ids)).decode() == "s = '🎉' + t\n"
    assert target_tokens(pair.target, committed, None, emoji[2:3], ended=True) == []  # not finished yet


@pytest.fixture
def drafter(pair) -> CrossTokenizerDrafter:
    """A random tiny draft model over the draft tokenizer's ids."""
    return CrossTokenizerDrafter(pair, tiny_model(7, vocab_size=len(pair.draft.pieces), max_position_embeddings=512),
                                 512)


def test_a_draft_token_over_two_target_tokens(pair, drafter, one_thread):
    """A draft token whose text the target spells with two tokens is proposed as both; when the
    target takes only the first, the draft's history drops that token and re-tokenizes the rest."""
    code = "    for i in range(10):\n        total += i * 2\n"
    spanning = next(t for t in pair.draft.encode(code) if len(pair.target.encode(pair.draft.pieces[t].decode())) >= 2)
    text = pair.draft.pieces[spanning]
    ids = target_tokens(pair.target, b"x = 1", None, text + b"y", ended=True)
    assert len(ids) >= 3 and spelled(pair, ids) == text + b"y"
    committed = pair.target.encode("x = 1")
    drafter.start(committed)
    drafter.propose(DraftState(committed, 2, SamplingParams(), None))
    drafter.drafted = [spanning]  # as if the draft had drafted it
    first, other = pair.target.encode(text.decode())[0], pair.target.encode("z")[0]
    drafter._catch_up(committed + [first, other])
    assert spanning not in drafter.history[len(drafter.bos):]
    assert pair.draft.text_bytes(drafter.history) == pair.target.text_bytes(committed + [first, other])


def test_control_tokens_are_never_proposed(pair):
    drafted = b"done.<|im_end|>\n<|endoftext|>"
    for ended in (True, False):
        ids = target_tokens(pair.target, b"ok ", None, drafted, ended=ended)
        assert ids and not set(ids) & pair.target.control
        assert drafted.startswith(spelled(pair, ids))  # the control strings are plain text at most


# ---- the draft's history and cache after verifications ----

def test_the_draft_history_spells_the_committed_text_after_each_verification(pair, drafter, one_thread):
    """Whatever the (random) draft drafts and however much of it the target keeps before a token of
    its own, the draft's history spells the committed text, and its cache holds that history."""
    prompt = pair.target.encode("<|im_start|>user\nWrite a loop<|im_end|>\n<|im_start|>assistant\n", specials=True)
    assert set(prompt) & pair.target.control
    answer = pair.target.encode("for i in range(3):\n    print(i, 'é🎉', i * 2)  # done\n")
    answer[8:8] = pair.target.encode_bytes("🎉".encode()[:2]) + pair.target.encode_bytes("🎉".encode()[2:])
    committed = list(prompt)
    drafter.start(committed)
    gen = torch.Generator().manual_seed(0)
    proposed = kept = 0
    for own in answer:
        proposal = drafter.propose(DraftState(committed, 4, SamplingParams(), None)).tokens.tolist()
        history, cached = drafter.history, drafter.inner.cached
        assert cached[:len(history)] == history and drafter.inner.cache.length == len(cached)
        assert not set(proposal) & pair.target.control
        take = int(torch.randint(0, len(proposal) + 1, (1,), generator=gen))
        proposed, kept = proposed + len(proposal), kept + take
        committed = committed + proposal[:take] + [own]  # the target keeps `take` draft tokens, then its own
        drafter._catch_up(committed)
        assert pair.draft.text_bytes(drafter.history) == pair.target.text_bytes(committed)
    assert proposed > 0 and kept > 0


# ---- greedy output equals plain decoding, with the real models ----

@pytest.fixture(scope="module")
def models():
    if not (is_present(TARGET) and is_present(DRAFT)):
        pytest.skip(f"needs {TARGET} and {DRAFT} installed")
    from specdec.model import load_model
    quiet = lambda message: None  # noqa: E731
    return (load_model(TARGET, device="cpu", progress=quiet),
            load_model(DRAFT, device="cpu", draft=True, progress=quiet))


PROMPTS = ["Write a Python function that returns the n-th Fibonacci number, with a docstring.",
           "Écris une phrase en français avec des accents, puis traduis-la en chinois (中文) avec un emoji 🎉."]


@pytest.mark.real
def test_greedy_output_is_plain_decoding_s(models):
    from specdec.model.tokenizer import encode_prompt
    target, draft = models
    notes = []
    drafter = make_drafter("draft", target, 1024, draft, draft_vocab=32768, note=notes.append)
    assert isinstance(drafter, CrossTokenizerDrafter) and notes and "across tokenizers" in notes[0]
    proposals = []
    propose = drafter.propose
    drafter.propose = lambda state: proposals.append(propose(state)) or proposals[-1]
    plain = Engine.single(target.module, NoDrafter(), 1024)
    spec = Engine.single(target.module, drafter, 1024)
    accepted = 0
    for k, prompt in zip((4, 6), PROMPTS):
        ids = encode_prompt(target.tokenizer, prompt, chat=True)
        cfg = GenerationConfig(64, k)
        expected = plain.generate(ids, cfg, target.eos_ids).tokens
        got = spec.generate(ids, cfg, target.eos_ids)
        first = next((i for i, (a, b) in enumerate(zip(got.tokens, expected)) if a != b), None)
        assert got.tokens == expected, f"first difference at {first}"
        accepted += got.stats.accepted
    assert accepted > 0  # the draft's text did get through
    control = {i for i, t in target.tokenizer.added_tokens_decoder.items() if t.special}
    assert all(not set(p.tokens.tolist()) & control for p in proposals)
    # sampling runs too (its exactness: the distribution test below)
    result = spec.generate(ids, GenerationConfig(24, 4, SamplingParams(0.8, seed=3)), target.eos_ids)
    assert 0 < len(result.tokens) <= 24


@pytest.mark.real
def test_with_prompt_lookup_too_greedy_output_is_plain_decoding_s(models):
    from specdec.drafters.hybrid import HybridDrafter
    from specdec.model.tokenizer import encode_prompt
    target, draft = models
    drafter = make_drafter("hybrid", target, 1024, draft, note=None)
    assert isinstance(drafter, HybridDrafter) and isinstance(drafter.model, CrossTokenizerDrafter)
    prompt = "Repeat this line twice: for (int i = 0; i < n; i++) { sum += a[i]; }"
    ids = encode_prompt(target.tokenizer, prompt, chat=True)
    cfg = GenerationConfig(48, 4)
    expected = Engine.single(target.module, NoDrafter(), 1024).generate(ids, cfg, target.eos_ids).tokens
    assert Engine.single(target.module, drafter, 1024).generate(ids, cfg, target.eos_ids).tokens == expected
    assert drafter.model_steps > 0


@pytest.mark.real
def test_the_server_s_slots_draft_across_tokenizers_one_row_at_a_time(models):
    """The slot pool (serve) with one drafter per slot: chains drafted row by row, verified together."""
    from specdec.model.tokenizer import encode_prompt
    from tests.conftest import run_engine
    target, draft = models
    prompts = [encode_prompt(target.tokenizer, p, chat=True) for p in PROMPTS + ["Sort a list in Python."]]
    cfg = GenerationConfig(32, 4)
    plain = Engine.single(target.module, NoDrafter(), 512)
    expected = {i: plain.generate(p, cfg, target.eos_ids).tokens for i, p in enumerate(prompts)}
    stepper = Engine(target.module, lambda: make_drafter("draft", target, 512, draft, note=None), 512,
                                max_batch=2)
    assert stepper.pool.draft_cache is None  # no batched draft forward: each slot drafts its own chain
    assert run_engine(stepper, prompts, cfg, target.eos_ids, limits=(None,)) == expected


@pytest.mark.real
def test_the_same_tokenizer_keeps_the_draft_model_drafter_and_trees_are_refused(models):
    from specdec.config import TreeConfig
    from specdec.drafters.draft_model import DraftModelDrafter
    target, draft = models
    same = make_drafter("draft", target, 256, target, note=None)  # waiting for its start with prompt lookup
    assert isinstance(same.model, DraftModelDrafter) and same.caps.lookup_only
    with pytest.raises(SpecdecError, match="chains across tokenizers, not trees"):
        make_drafter("draft", target, 256, draft, tree=TreeConfig(8, 4, 4), note=None)


# ---- sampling keeps the target's distribution ----

def test_sampling_across_tokenizers_keeps_the_target_distribution(one_thread):
    """A tiny target over the toy tokens 'a', 'b', 'ab' and a tiny draft over 'a', 'b', 'ba' and an
    end token: tokens 2 and 3 come from verifying re-tokenized drafts, one-hot q."""
    target_tok, draft_tok = ToyTokenizer(["a", "b", "ab"]), ToyTokenizer(["a", "b", "ba"], ["<end>"])
    pair = Bridge(TokenText.of(target_tok), TokenText.of(draft_tok), 1.0)
    target = tiny_model(10, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    draft = tiny_model(12, vocab_size=4, max_position_embeddings=64)
    prompt = [0, 1, 2, 0, 1]
    sampling = SamplingParams(1.0)
    joint = exact_joint(target, prompt, 3, sampling)
    engine = Engine.single(target, CrossTokenizerDrafter(pair, draft, 64), 64)
    counts, drafted, accepted = {}, 0, 0
    for seed in range(N_TRIALS):
        result = engine.generate(prompt, GenerationConfig(4, 3, SamplingParams(1.0, seed=seed)))
        seq = tuple(result.tokens[:3])
        counts[seq] = counts.get(seq, 0) + 1
        drafted, accepted = drafted + result.stats.drafted, accepted + result.stats.accepted
    assert drafted > N_TRIALS and 0 < accepted < drafted  # drafts were verified, some kept, some not
    assert tv(counts, joint, N_TRIALS) < tv_bound(len(joint), N_TRIALS)
