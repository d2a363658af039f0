import pytest
import torch

from specdec.errors import SpecdecError
from specdec.model.kv_cache import KVCache


def filled(length: int, capacity: int = 8) -> KVCache:
    """A cache whose slot s holds the value s in every key/value entry."""
    cache = KVCache(n_layers=2, n_kv_heads=1, head_dim=2, capacity=capacity)
    slots = torch.arange(capacity, dtype=torch.float32).view(1, 1, 1, capacity, 1)
    cache.k[:] = slots
    cache.v[:] = -slots
    cache.advance(length)
    return cache


def slot_values(cache: KVCache) -> list[int]:
    return cache.k[0, 0, 0, :cache.length, 0].long().tolist()


def test_truncate_is_o1_and_keeps_prefix():
    cache = filled(6)
    cache.truncate(3)
    assert cache.length == 3 and slot_values(cache) == [0, 1, 2]
    with pytest.raises(ValueError):
        cache.truncate(4)


@pytest.mark.parametrize("indices, expected", [
    ([0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]),  # keep everything: no copy
    ([0, 1, 2, 4, 5], [0, 1, 2, 4, 5]),  # drop one slot in the middle
    ([0, 1, 3, 5], [0, 1, 3, 5]),  # a tree path: prefix then scattered accepted nodes
    ([2, 3], [2, 3]),
    ([], []),
])
def test_keep_table(indices, expected):
    cache = filled(6)
    cache.keep(indices)
    assert cache.length == len(expected)
    assert slot_values(cache) == expected
    assert cache.v[1, 0, 0, :cache.length, 1].long().tolist() == [-e for e in expected]


@pytest.mark.parametrize("bad", [[1, 0], [0, 0], [0, 6]])
def test_keep_rejects_unsorted_or_out_of_range(bad):
    with pytest.raises(ValueError):
        filled(6).keep(bad)


def test_capacity_is_enforced_with_clear_error():
    cache = filled(6)
    cache.advance(2)
    with pytest.raises(SpecdecError, match="context"):
        cache.advance(1)
