"""Token lists: the small helpers that drafters and the server's prefix cache share."""

from __future__ import annotations


def common_prefix(a: list[int], b: list[int], start: int = 0) -> int:
    """The length of the longest common prefix of a and b, given that their first `start` tokens agree."""
    n = min(len(a), len(b))
    i = start
    while i < n and a[i] == b[i]:
        i += 1
    return i
