import numpy as np
import pytest

from specdec.config import SamplingParams
from specdec.drafters.base import DraftState
from specdec.drafters.ngram import NgramConfig, NgramDrafter, ngram_continuation
from specdec.errors import SpecdecError


@pytest.mark.parametrize("tokens, k, max_n, min_n, expected", [
    ([1, 2, 3, 4, 1, 2], 2, 3, 1, [3, 4]),  # bigram [1, 2] seen before
    ([1, 2, 3, 4, 9, 2], 3, 3, 1, [3, 4, 9]),  # falls back to the unigram [2]
    ([1, 2, 3, 4, 9, 2], 3, 3, 2, []),  # min_n = 2: unigram not allowed
    ([5, 6, 7], 2, 3, 1, []),  # nothing repeats
    ([1, 2, 7, 1, 2, 8, 1, 2], 1, 2, 1, [8]),  # most recent match with a full continuation
    ([1, 2, 3, 1, 2, 3, 1, 2], 4, 2, 1, [3, 1, 2, 3]),  # long continuation wins over a short recent one
    ([4], 3, 3, 1, []),  # a single token cannot match itself
])
def test_ngram_continuation_table(tokens, k, max_n, min_n, expected):
    got = ngram_continuation(np.array(tokens, dtype=np.int64), k, max_n, min_n)
    assert got.tolist() == expected


def test_ngram_drafter_proposes_a_chain_with_one_hot_q():
    tree = NgramDrafter(3, 1).propose(DraftState([1, 2, 3, 1, 2], 4, SamplingParams(), None))
    assert tree.tokens.tolist() == [3, 1, 2] and tree.q is None and tree.is_chain


def test_ngram_config_is_validated():
    with pytest.raises(SpecdecError):
        NgramConfig(max_n=1, min_n=2)
    with pytest.raises(SpecdecError):
        NgramConfig(max_n=3, min_n=0)
