"""Draft trees as data. A chain is a tree with one branch (parents = -1, 0, 1, ...).

Nodes 0..n-1 are stored in topological order (parents[i] < i); the root is the last committed
token and is not a node. Index -1 names the root wherever a node index is expected. Tensors that
cover the root as well ([n + 1, ...]) put it at row 0 and node i at row i + 1.

The structure helpers read `parents` on the host (`tolist`), so keep `parents` on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from specdec.config import rank_paths
from specdec.errors import SpecdecError


@dataclass
class DraftTree:
    """Draft tokens proposed after the last committed token.

    parents[i] is the index of node i's parent, or -1 for a child of the root. Siblings are
    ordered by index: a verifier tries them in that order.
    q[i] is the draft distribution node i's parent proposed its children from (before any
    without-replacement removal), so siblings share it; `parent_q` regroups it per parent.
    free[i] (a chain's, under a grammar): node i is a token the grammar forced, drafted for free;
    the policy learns from the other nodes alone.
    """

    tokens: torch.Tensor  # [n] int64
    parents: torch.Tensor  # [n] int64, on the CPU
    q: torch.Tensor | None = None  # [n, vocab] draft probabilities; None = deterministic (one-hot)
    free: list[bool] | None = None  # [n]; None: no node is forced

    @staticmethod
    def chain(tokens: torch.Tensor, q: torch.Tensor | None = None, free: list[bool] | None = None) -> "DraftTree":
        n = tokens.numel()
        return DraftTree(tokens.reshape(n), torch.arange(-1, n - 1), q, free if free and any(free) else None)

    def head(self, n: int) -> "DraftTree":
        """A chain's first n nodes."""
        return DraftTree.chain(self.tokens[:n], None if self.q is None else self.q[:n],
                               None if self.free is None else self.free[:n])

    def extended(self, tokens: list[int]) -> "DraftTree":
        """A chain with the grammar's forced `tokens` after it (free; their q one-hot where q is kept)."""
        more = torch.tensor(tokens, dtype=torch.long, device=self.tokens.device)  # [m]
        q = self.q
        if q is not None:
            q = torch.cat([q, torch.nn.functional.one_hot(more, q.shape[-1]).to(q.dtype)])
        free = (self.free or [False] * len(self)) + [True] * len(tokens)
        return DraftTree.chain(torch.cat([self.tokens, more]), q, free)

    @staticmethod
    def empty(device: torch.device | str = "cpu") -> "DraftTree":
        return DraftTree.chain(torch.empty(0, dtype=torch.long, device=device))

    def __len__(self) -> int:
        return self.tokens.numel()

    @cached_property
    def is_chain(self) -> bool:  # read several times a step: once is enough (parents are never reassigned)
        return bool(torch.equal(self.parents.cpu(), torch.arange(-1, len(self) - 1)))

    def validate(self) -> None:
        """Raise SpecdecError unless tokens # [n], parents # [n] with -1 <= parents[i] < i, q # [n, vocab]."""
        self._parent_list()

    @property
    def depth(self) -> torch.Tensor:
        """# [n] int64: 1 for children of the root, parent's depth + 1 below."""
        depth: list[int] = []
        for parent in self._parent_list():
            depth.append(1 if parent < 0 else depth[parent] + 1)
        return torch.tensor(depth, dtype=torch.long)

    def position_offsets(self) -> torch.Tensor:
        """# [n + 1] int64 over [root] + nodes: 0 for the root, depth for nodes.

        Absolute position = cache length (the root's position) + offset; siblings share a position.
        """
        return torch.cat([torch.zeros(1, dtype=torch.long), self.depth])

    def tree_mask(self) -> torch.Tensor:
        """# [n + 1, n + 1] bool over [root] + nodes: row r sees column c iff c is r or an ancestor of r."""
        paths = self._paths_to_all()
        rows = [0] + [i + 1 for i, path in enumerate(paths) for _ in range(len(path) + 1)]
        cols = [0] + [c for path in paths for c in [0] + [j + 1 for j in path]]
        mask = torch.zeros(len(paths) + 1, len(paths) + 1, dtype=torch.bool)
        mask[rows, cols] = True
        return mask

    def children(self, i: int) -> list[int]:
        """Indices of node i's children in sibling order; i = -1 gives the root's children."""
        parents = self._parent_list()
        if not -1 <= i < len(parents):
            raise SpecdecError(f"node {i} is not in a draft tree of {len(parents)} nodes (use -1 for the root)")
        return [j for j, parent in enumerate(parents) if parent == i]

    def path_to(self, i: int) -> list[int]:
        """Node indices from the root's child down to node i, inclusive; [] for the root (i = -1)."""
        paths = self._paths_to_all()
        if not -1 <= i < len(paths):
            raise SpecdecError(f"node {i} is not in a draft tree of {len(paths)} nodes (use -1 for the root)")
        return [] if i < 0 else paths[i]

    def paths(self) -> list[list[int]]:
        """One root-to-leaf index list per leaf node, in leaf index order ([] for an empty tree)."""
        paths = self._paths_to_all()
        has_child = set(self._parent_list())
        return [path for i, path in enumerate(paths) if i not in has_child]

    def parent_q(self) -> torch.Tensor | None:
        """Draft distributions per parent, # [n + 1, vocab] rows indexed like p (row 0 = root), or None.

        Row parents[i] + 1 is q[i] of the parent's first child; rows of leaves are zero (unused).
        """
        if self.q is None:
            return None
        first: dict[int, int] = {}  # parent -> its first child
        for i, parent in enumerate(self._parent_list()):
            first.setdefault(parent, i)
        rows = torch.tensor([parent + 1 for parent in first], dtype=torch.long, device=self.q.device)  # [m]
        nodes = torch.tensor(list(first.values()), dtype=torch.long, device=self.q.device)  # [m]
        out = self.q.new_zeros(len(self) + 1, self.q.shape[1])  # [n + 1, vocab]
        return out.index_copy_(0, rows, self.q.index_select(0, nodes))

    def _parent_list(self) -> list[int]:
        """parents as Python ints after checking shapes and topological order (SpecdecError)."""
        n = len(self)
        if self.tokens.dim() != 1 or self.parents.shape != (n,):
            raise SpecdecError(f"draft tree needs tokens [n] and parents [n]; got {tuple(self.tokens.shape)} "
                               f"and {tuple(self.parents.shape)}")
        if self.tokens.is_floating_point() or self.parents.is_floating_point():
            raise SpecdecError("draft tree tokens and parents must be integer tensors")
        if self.q is not None and (self.q.dim() != 2 or self.q.shape[0] != n):
            raise SpecdecError(f"draft tree q must be [n, vocab] with n = {n}; got {tuple(self.q.shape)}")
        parents = self.parents.tolist()
        for i, parent in enumerate(parents):
            if not -1 <= parent < i:
                raise SpecdecError(f"draft tree node {i} has parent {parent}; parents must be -1 (root) or "
                                   f"an earlier node (topological order, -1 <= parents[i] < i)")
        return parents

    def _paths_to_all(self) -> list[list[int]]:
        """For every node i, path_to(i)."""
        paths: list[list[int]] = []
        for i, parent in enumerate(self._parent_list()):
            paths.append((paths[parent] if parent >= 0 else []) + [i])
        return paths


def choices_to_parents(choices: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A static tree from Medusa-style rank paths -> (parents # [n], ranks # [n]), int64 on the CPU, in
    config.rank_paths' order (breadth first, siblings by rank: parents precede their children); raises
    SpecdecError where rank_paths does."""
    parents, ranks = rank_paths(choices)
    return torch.tensor(parents, dtype=torch.long), torch.tensor(ranks, dtype=torch.long)
