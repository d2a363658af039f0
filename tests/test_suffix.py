"""Suffix drafting: the automaton, the drafter's proposal rule and cache, datastores, the engine."""

import json
import random

import numpy as np
import pytest

from specdec.config import GenerationConfig, SamplingParams
from specdec.drafters.datastore import (build_datastore, datastore_from_files, load_datastore, tokenizer_fingerprint)
from specdec.drafters.base import DraftState, NoDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.drafters.suffix_automaton import SuffixAutomaton
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from tests.test_engine import PROMPTS


def automaton(*docs):
    sam = SuffixAutomaton()
    for doc in docs:
        sam.add_document(doc)
    return sam


def propose(drafter, tokens, k=8):
    return drafter.propose(DraftState(list(tokens), k, SamplingParams(), None)).tokens.tolist()


# --- the automaton ---------------------------------------------------------------------------

@pytest.mark.parametrize("docs, query, length", [
    ([[1, 2, 3, 1, 2, 4]], [9, 1, 2], 2),
    ([[1, 2, 3, 1, 2, 4]], [3, 1, 2], 3),
    ([[1, 2, 3, 1, 2, 4]], [2, 4], 2),
    ([[1, 2, 3, 1, 2, 4]], [4, 1], 1),
    ([[1, 2, 3, 1, 2, 4]], [5], 0),
    ([[1, 2], [3, 4]], [1, 2, 3], 1),  # "2 3" spans two documents: only "3" matches
    ([[1, 2], [3, 4]], [3, 4], 2),
    ([[7, 7, 7, 7]], [7, 7, 7, 7, 7], 4),
    ([], [1], 0),
])
def test_longest_match(docs, query, length):
    sam = automaton(*docs)
    assert sam.match(query).length == length
    assert sam.num_states <= max(1, 2 * len(sam) - 1)
    if docs:
        assert sam.freeze().match(query).length == length


@pytest.mark.parametrize("docs, query, first, frequent, counts", [
    # first occurrence of "1 2" is followed by 4, the most frequent continuation is 3
    ([[1, 2, 4, 1, 2, 3, 1, 2, 3]], [1, 2], [4, 1, 2], [3, 1, 2], [(3, 2), (4, 1)]),
    ([[1, 2, 3, 1, 2, 4, 1, 2, 3]], [1, 2], [3, 1, 2], [3, 1, 2], [(3, 2), (4, 1)]),
    ([[5, 6], [6, 7]], [6], [7], [7], [(7, 1)]),  # the first 6 ends a document: use the other one
    ([[5, 6], [6, 7]], [5, 6], [], [], []),  # nothing follows "5 6" inside a document
    ([[1, 2], [3]], [2], [], [], []),
])
def test_continuations(docs, query, first, frequent, counts):
    sam = automaton(*docs)
    frozen = sam.freeze()
    assert sam.continuation(sam.match(query).state, 3) == first
    state = frozen.match(query).state
    assert frozen.continuation(state, 3) == frequent
    assert frozen.continuations(state) == counts


def test_continuation_respects_n():
    sam = automaton([1, 2, 3, 4, 5, 6, 1, 2])
    assert sam.continuation(sam.match([1, 2]).state, 2) == [3, 4]
    assert sam.continuation(sam.match([1, 2]).state, 0) == []


def occurrences(docs, s):
    return sum(doc[i:i + len(s)] == s for doc in docs for i in range(len(doc) - len(s) + 1))


def test_automaton_against_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        docs = [[rng.randrange(3) for _ in range(rng.randrange(12))] for _ in range(rng.randrange(1, 4))]
        query = [rng.randrange(3) for _ in range(rng.randrange(1, 8))]
        sam = automaton(*docs)
        expected = max([n for n in range(1, len(query) + 1) if occurrences(docs, query[-n:])], default=0)
        match = sam.match(query)
        assert match.length == expected
        if not any(docs):
            continue
        frozen = sam.freeze()
        state = frozen.match(query).state
        suffix = query[len(query) - expected:]
        if expected:
            assert frozen.counts[state] == occurrences(docs, suffix)
        for token, count in frozen.continuations(state):
            assert count == occurrences(docs, suffix + [token])
        for cont in (sam.continuation(match.state, 4), frozen.continuation(state, 4)):
            assert occurrences(docs, suffix + cont) > 0


def test_repeated_suffix():
    sam = automaton([1, 2, 3, 9, 1, 2])
    assert sam.repeated_suffix().length == 2
    assert sam.continuation(sam.repeated_suffix().state, 4) == [3, 9, 1, 2]
    assert automaton([1, 2, 3]).repeated_suffix().length == 0


# --- the drafter -------------------------------------------------------------------------------

def test_proposal_length_follows_match_length_and_k():
    text = [10, 11, 12, 13, 14, 15, 16, 17, 99]
    drafter = SuffixDrafter()
    drafter.start(text)
    assert propose(drafter, text + [10]) == [11, 12]  # match 1 -> 2 tokens
    assert propose(drafter, text + [10, 11, 12]) == [13, 14, 15, 16]  # match 3 -> 4 tokens
    assert propose(drafter, text + [10, 11, 12, 13, 14, 15, 16]) == [17, 99, 10, 11, 12, 13, 14, 15]
    assert propose(drafter, text + [10, 11, 12, 13, 14, 15, 16], k=3) == [17, 99, 10]
    assert propose(drafter, text + [10, 11, 12, 13, 14, 15, 16, 50]) == []  # 50 never seen


def test_min_match():
    drafter = SuffixDrafter(min_match=3)
    drafter.start([1, 2, 3, 4, 5, 1, 2])
    assert propose(drafter, [1, 2, 3, 4, 5, 1, 2]) == []
    assert propose(drafter, [1, 2, 3, 4, 5, 1, 2, 3]) == [4, 5, 1, 2]


def test_cache_of_earlier_requests_across_start():
    drafter = SuffixDrafter()
    drafter.start([1, 2, 3])
    propose(drafter, [1, 2, 3, 4, 5, 6, 7])
    drafter.start([40, 3, 4])
    assert propose(drafter, [40, 3, 4]) == [5, 6, 7]  # from the cache; stops at the document's end


def test_longest_match_wins_and_ties_prefer_the_request():
    drafter = SuffixDrafter()
    drafter.start([1, 2, 3, 4, 5, 6, 7])
    propose(drafter, [1, 2, 3, 4, 5, 6, 7])
    drafter.start([9, 4, 5, 8, 3, 4, 5])  # request repeats "4 5" (2), the cache has "3 4 5" (3)
    assert propose(drafter, [9, 4, 5, 8, 3, 4, 5]) == [6, 7]
    drafter.start([4, 5, 8, 4, 5])  # both match "4 5": the request's continuation wins
    assert propose(drafter, [4, 5, 8, 4, 5]) == [8, 4, 5]


def test_datastore_source_proposes_the_most_frequent_continuation():
    store = build_datastore([[1, 2, 4, 0], [1, 2, 3, 0], [1, 2, 3, 0]], "fp")
    drafter = SuffixDrafter(max_cache_tokens=0, datastore=store)
    drafter.start([7, 1, 2])
    assert propose(drafter, [7, 1, 2]) == [3, 0]


def test_cache_stays_within_its_bound():
    rng = random.Random(0)
    drafter = SuffixDrafter(max_cache_tokens=2000)
    for _ in range(500):
        tokens = [rng.randrange(50) for _ in range(rng.randrange(1, 300))]
        drafter.start(tokens[:5])
        propose(drafter, tokens)
        assert drafter.cache_tokens <= 2000
    last = [rng.randrange(50) for _ in range(100)]
    drafter.start(last[:5])
    propose(drafter, last)
    drafter.start([99])
    assert 2000 * 3 // 4 - 300 <= drafter.cache_tokens <= 2000
    assert propose(drafter, [99] + last[:20], k=3) == last[20:23]  # the newest request is kept


def test_oversized_request_keeps_its_tail():
    drafter = SuffixDrafter(max_cache_tokens=100)
    drafter.start([0])
    propose(drafter, list(range(1000)))
    drafter.start([0])
    assert drafter.cache_tokens == 74  # 3/4 of the bound, minus one separator
    assert propose(drafter, [5000, 989, 990], k=3) == [991, 992, 993]


def test_a_sequence_that_does_not_extend_the_last_one_starts_afresh():
    drafter = SuffixDrafter(max_cache_tokens=0)
    drafter.start([1, 2, 3, 1])
    assert propose(drafter, [1, 2, 3, 1]) == [2, 3]
    assert propose(drafter, [5, 6, 5]) == [6, 5]


@pytest.mark.parametrize("kwargs", [dict(max_cache_tokens=-1), dict(min_match=0)])
def test_bad_arguments(kwargs):
    with pytest.raises(SpecdecError):
        SuffixDrafter(**kwargs)


# --- datastores -----------------------------------------------------------------------------------

class WordTokenizer:
    """Whitespace words to ids, just enough of the Hugging Face tokenizer interface."""

    def __init__(self, words):
        self.vocab = {w: i for i, w in enumerate(words)}

    def get_vocab(self):
        return dict(self.vocab)

    def encode(self, text, add_special_tokens=True):
        return [self.vocab[w] for w in text.split()]


WORDS = "def return if else for in x y z".split()


def test_datastore_round_trip(tmp_path):
    store = build_datastore([[1, 2, 3, 1, 2, 4], [], [5, 6]], "abc")
    assert (store.num_tokens, store.num_documents) == (8, 2)
    path = tmp_path / "store.npz"
    store.save(path)
    loaded = load_datastore(path, "abc")
    assert loaded.fingerprint == "abc"
    assert np.array_equal(loaded.tokens, store.tokens) and np.array_equal(loaded.offsets, store.offsets)
    for name, array in store.automaton.arrays().items():
        assert np.array_equal(getattr(loaded.automaton, name), array)
    assert loaded.automaton.match([9, 1, 2]).length == 2


def test_datastore_load_errors(tmp_path):
    path = tmp_path / "store.npz"
    build_datastore([[1, 2, 3]], "abc").save(path)
    with pytest.raises(SpecdecError, match="another tokenizer"):
        load_datastore(path, "xyz")
    with pytest.raises(SpecdecError, match="not found"):
        load_datastore(tmp_path / "missing.npz", "abc")
    data = path.read_bytes()
    for name, content in [("truncated.npz", data[:len(data) // 2]), ("random.npz", bytes(range(256)) * 4),
                          ("empty.npz", b"")]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(SpecdecError, match="corrupt"):
            load_datastore(tmp_path / name, "abc")
    np.savez(tmp_path / "other.npz", tokens=np.arange(3))
    with pytest.raises(SpecdecError, match="corrupt"):
        load_datastore(tmp_path / "other.npz", "abc")


@pytest.mark.parametrize("docs", [[], [[]], [[], []]])
def test_empty_corpus(docs):
    with pytest.raises(SpecdecError, match="empty corpus"):
        build_datastore(docs, "abc")


def test_datastore_from_files(tmp_path):
    tok = WordTokenizer(WORDS)
    (tmp_path / "a.py").write_text("def x return y")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "for x in y"}) + "\n\n" + json.dumps({"prompt": "if z"}))
    store = datastore_from_files([str(tmp_path / "a.py"), str(tmp_path / "b.jsonl")], tok)
    assert store.num_documents == 3 and store.tokens.tolist() == [0, 6, 1, 7, 4, 6, 5, 7, 2, 8]
    assert store.fingerprint == tokenizer_fingerprint(tok) != tokenizer_fingerprint(WordTokenizer(WORDS[::-1]))


def test_datastore_from_files_errors(tmp_path):
    tok = WordTokenizer(WORDS)
    with pytest.raises(SpecdecError, match="not found"):
        datastore_from_files([str(tmp_path / "missing.txt")], tok)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(SpecdecError, match="empty"):
        datastore_from_files([str(tmp_path / "empty.txt")], tok)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"title": "x"}) + "\n")
    with pytest.raises(SpecdecError, match="bad.jsonl:1"):
        datastore_from_files([str(tmp_path / "bad.jsonl")], tok)


# --- in the engine ---------------------------------------------------------------------------------

def generate(target, drafter, prompt, sampling=SamplingParams()):
    return Engine.single(target, drafter, capacity=256).generate(prompt, GenerationConfig(40, 4, sampling))


def test_greedy_equivalence_tiny(tiny_target):
    expected = [generate(tiny_target, NoDrafter(), p).tokens for p in PROMPTS]
    store = build_datastore([PROMPTS[2] + expected[2][:10]], "fp")
    drafter = SuffixDrafter(max_cache_tokens=500, datastore=store)
    for round in range(2):
        for prompt, tokens in zip(PROMPTS, expected):
            result = generate(tiny_target, drafter, prompt)
            assert result.tokens == tokens, f"round {round} diverged on prompt {prompt}"
            if round == 1:  # the same request again: the cache holds its output
                assert result.stats.alpha > 0.8


def test_sampling_runs(tiny_target):
    drafter = SuffixDrafter()
    for seed in range(2):
        result = generate(tiny_target, drafter, PROMPTS[1], SamplingParams(temperature=1.0, seed=seed))
        assert len(result.tokens) == 40
