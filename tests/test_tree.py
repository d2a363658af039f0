"""Draft trees: structure (mask, positions, paths, validation, Medusa choices) and tree verification
(greedy matching and multi-candidate rejection sampling, whose emitted tokens must follow the target)."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.sampling.rejection import greedy_accept, rejection_accept
from specdec.sampling.tree_accept import TreeAcceptance, greedy_tree_accept, tree_rejection_accept
from specdec.tree import DraftTree, choices_to_parents


def make_tree(parents: list[int], tokens: list[int] | None = None) -> DraftTree:
    tokens = list(range(len(parents))) if tokens is None else tokens
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))


# ---------------------------------------------------------------- structure

# Branching example:     root
#                       /     \
#                      0       1
#                     / \      |
#                    2   3     4
#                    |
#                    5
BRANCHING = [-1, -1, 0, 0, 1, 2]


@pytest.mark.parametrize("parents, depth, paths, mask_rows", [
    ([], [], [], [[1]]),
    ([-1, 0, 1], [1, 2, 3], [[0, 1, 2]], [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]),
    ([-1, -1, -1], [1, 1, 1], [[0], [1], [2]], [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]]),
    (BRANCHING, [1, 1, 2, 2, 2, 3], [[0, 3], [1, 4], [0, 2, 5]],  # by leaf index
     [[1, 0, 0, 0, 0, 0, 0],
      [1, 1, 0, 0, 0, 0, 0],
      [1, 0, 1, 0, 0, 0, 0],
      [1, 1, 0, 1, 0, 0, 0],
      [1, 1, 0, 0, 1, 0, 0],
      [1, 0, 1, 0, 0, 1, 0],
      [1, 1, 0, 1, 0, 0, 1]]),
])
def test_structure_table(parents, depth, paths, mask_rows):
    tree = make_tree(parents)
    assert tree.depth.tolist() == depth and tree.depth.dtype == torch.long
    assert tree.position_offsets().tolist() == [0] + depth
    assert tree.paths() == paths
    mask = tree.tree_mask()
    assert mask.dtype == torch.bool and mask.shape == (len(parents) + 1, len(parents) + 1)
    assert mask.int().tolist() == mask_rows
    assert tree.is_chain == (parents == list(range(-1, len(parents) - 1)))


def test_children_and_path_to():
    tree = make_tree(BRANCHING)
    assert [tree.children(i) for i in range(-1, 6)] == [[0, 1], [2, 3], [4], [5], [], [], []]
    assert [tree.path_to(i) for i in range(-1, 6)] == [[], [0], [1], [0, 2], [0, 3], [1, 4], [0, 2, 5]]
    for bad in (-2, 6):
        with pytest.raises(SpecdecError, match="not in a draft tree"):
            tree.children(bad)
        with pytest.raises(SpecdecError, match="not in a draft tree"):
            tree.path_to(bad)


def test_chain_and_empty_keep_working():
    chain = DraftTree.chain(torch.tensor([[4, 5, 6]]))
    assert chain.tokens.shape == (3,) and chain.parents.tolist() == [-1, 0, 1] and chain.is_chain
    assert len(chain) == 3 and chain.paths() == [[0, 1, 2]]
    empty = DraftTree.empty()
    assert len(empty) == 0 and empty.is_chain and empty.tree_mask().tolist() == [[True]]
    assert empty.position_offsets().tolist() == [0]


@pytest.mark.parametrize("tokens, parents, q, msg", [
    ([1, 2], [0, -1], None, "node 0 has parent 0"),  # not topological: a node's own index
    ([1, 2, 3], [-1, 2, 0], None, "node 1 has parent 2"),  # parent after the child
    ([1, 2], [-1, -2], None, "node 1 has parent -2"),  # out of range below
    ([1, 2, 3], [-1, 0], None, "tokens \\[n\\] and parents \\[n\\]"),  # length mismatch
    ([[1, 2]], [-1, 0], None, "tokens \\[n\\] and parents \\[n\\]"),  # tokens not 1-D
    ([1, 2], [-1.0, 0.0], None, "integer"),
    ([1, 2], [-1, 0], torch.full((3, 4), 0.25), "q must be \\[n, vocab\\]"),
])
def test_validate_rejects_bad_trees(tokens, parents, q, msg):
    tree = DraftTree(torch.tensor(tokens), torch.tensor(parents), q)
    with pytest.raises(SpecdecError, match=msg):
        tree.validate()
    with pytest.raises(SpecdecError):
        tree.tree_mask()


def test_parent_q_regroups_per_node_q():
    q = torch.arange(20, dtype=torch.float).view(5, 4)  # [n, vocab]; row i = node i's q
    tree = DraftTree(torch.zeros(5, dtype=torch.long), torch.tensor([-1, -1, 0, 0, 2]), q)
    expected = torch.stack([q[0], q[2], torch.zeros(4), q[4], torch.zeros(4), torch.zeros(4)])  # [n + 1, vocab]
    torch.testing.assert_close(tree.parent_q(), expected)
    assert make_tree([-1, 0]).parent_q() is None


# ---------------------------------------------------------------- choices_to_parents


@pytest.mark.parametrize("choices, parents, ranks", [
    ([[0]], [-1], [0]),
    ([[0], [1], [0, 0], [0, 1], [1, 0]], [-1, -1, 0, 0, 1], [0, 1, 0, 1, 0]),
    ([[1, 0], [0, 0], [1], [0]], [-1, -1, 0, 1], [0, 1, 0, 0]),  # sorted: [0], [1], [0, 0], [1, 0]
    ([(0,), (0, 0), (0, 0, 0)], [-1, 0, 1], [0, 0, 0]),  # tuples; a chain
    ([[0], [2], [0, 3], [2, 1], [0, 3, 0]], [-1, -1, 0, 1, 2], [0, 2, 3, 1, 0]),  # rank gaps are allowed
])
def test_choices_to_parents_table(choices, parents, ranks):
    got_parents, got_ranks = choices_to_parents(choices)
    assert got_parents.tolist() == parents and got_ranks.tolist() == ranks
    assert got_parents.dtype == torch.long and got_ranks.dtype == torch.long
    make_tree(parents).validate()


@pytest.mark.parametrize("choices, msg", [
    ([], "choices are empty"),
    ("[[0]]", "must be a list of rank paths"),
    ([[0], 1], "not a non-empty list of ints"),
    ([[0], []], "not a non-empty list of ints"),
    ([[0], [0.0]], "not a non-empty list of ints"),
    ([[0], [True]], "not a non-empty list of ints"),
    ([[0], [-1]], "negative rank"),
    ([[0], [0, 0, 1]], "needs its prefix \\[0, 0\\]"),
    ([[0, 0]], "needs its prefix \\[0\\]"),
    ([[0], [1], [0]], "duplicate tree choice \\[0\\]"),
])
def test_choices_to_parents_errors(choices, msg):
    with pytest.raises(SpecdecError, match=msg):
        choices_to_parents(choices)


# ---------------------------------------------------------------- greedy_tree_accept


def logits_with_argmax(best: list[int], vocab: int = 8) -> torch.Tensor:
    """Hand-built logits # [len(best), vocab] whose row i has its argmax at best[i]."""
    logits = torch.randn(len(best), vocab, generator=torch.Generator().manual_seed(7))  # [n + 1, vocab]
    logits[torch.arange(len(best)), best] = 10.0
    return logits


# BRANCHING with tokens: node 0 = 5, 1 = 3, 2 = 1, 3 = 2, 4 = 7, 5 = 6.
# best[r]: the target's argmax at row r (0 = root, i + 1 = node i).
@pytest.mark.parametrize("best, expected", [
    ([5, 1, 0, 0, 0, 0, 0], ([0, 2], 0)),  # first branch to node 2, not to its child 5
    ([5, 1, 0, 6, 0, 0, 4], ([0, 2, 5], 4)),  # full accept down the deepest leaf + bonus
    ([3, 0, 7, 0, 0, 2, 0], ([1, 4], 2)),  # the root's second child wins; its leaf's bonus
    ([3, 0, 5, 0, 0, 0, 0], ([1], 5)),  # second child, then its child is rejected
    ([5, 2, 0, 0, 6, 0, 0], ([0, 3], 6)),  # second grandchild of the first branch, a leaf
    ([4, 1, 0, 0, 0, 0, 0], ([], 4)),  # nothing accepted: the root's own prediction
])
def test_greedy_tree_accept_exact(best, expected):
    tree = make_tree(BRANCHING, [5, 3, 1, 2, 7, 6])
    result = greedy_tree_accept(tree, logits_with_argmax(best))
    assert result == expected
    assert isinstance(result, TreeAcceptance) and result.num_accepted == len(expected[0])
    assert all(isinstance(i, int) for i in result.path) and isinstance(result.next_token, int)


def test_greedy_tree_accept_edges():
    assert greedy_tree_accept(DraftTree.empty(), logits_with_argmax([6])) == ([], 6)
    same = make_tree([-1, -1, 1], [2, 2, 4])  # equal sibling tokens: the first is taken
    assert greedy_tree_accept(same, logits_with_argmax([2, 3, 4, 1])) == ([0], 3)


def test_greedy_tree_on_chains_matches_greedy_accept():
    gen = torch.Generator().manual_seed(5)
    for k in range(5):
        for _ in range(20):
            logits = torch.randn(k + 1, 6, generator=gen)  # [k + 1, vocab]
            draft = torch.where(torch.rand(k, generator=gen) < 0.7, logits[:-1].argmax(-1),
                                torch.randint(6, (k,), generator=gen))  # [k]
            num, token = greedy_accept(draft, logits)
            assert greedy_tree_accept(DraftTree.chain(draft), logits) == (list(range(num)), token)


# ---------------------------------------------------------------- tree_rejection_accept: exact equivalences


def normalised(x: torch.Tensor) -> torch.Tensor:
    return x / x.sum(dim=-1, keepdim=True)


def random_tree(gen: torch.Generator, n: int, vocab: int) -> DraftTree:
    parents = [int(torch.randint(-1, i, (), generator=gen)) if i else -1 for i in range(n)]
    return make_tree(parents, torch.randint(vocab, (n,), generator=gen).tolist())


def test_chain_matches_rejection_accept_seed_for_seed():
    """A chain through the tree verifier gives exactly the chain verifier's result, same generator."""
    gen = torch.Generator().manual_seed(1)
    for trial in range(200):
        k = trial % 5
        p = normalised(torch.rand(k + 1, 6, generator=gen) ** 3)  # [k + 1, vocab]
        q = normalised(torch.rand(k, 6, generator=gen) ** 3)  # [k, vocab]
        draft = torch.multinomial(q, 1, generator=gen).view(k) if k else torch.empty(0, dtype=torch.long)
        chain = DraftTree.chain(draft, q)
        for q_row, per_parent in ((q, chain.parent_q()), (None, None)):
            num, token = rejection_accept(draft, p, q_row, torch.Generator().manual_seed(trial))
            for replacement in (True, False):
                got = tree_rejection_accept(chain, p, per_parent, torch.Generator().manual_seed(trial), replacement)
                assert got == (list(range(num)), token)


def test_one_hot_target_makes_rejection_greedy():
    """With temperature-0 p every rule reduces to greedy matching, for any tree and seed."""
    gen = torch.Generator().manual_seed(2)
    vocab = 5
    for trial in range(150):
        tree = random_tree(gen, trial % 9, vocab)
        logits = torch.randn(len(tree) + 1, vocab, generator=gen)  # [n + 1, vocab]
        best = logits.argmax(-1)  # [n + 1]
        hit = torch.rand(len(tree), generator=gen) < 0.6  # [n]
        tree.tokens = torch.where(hit, best[tree.parents + 1], tree.tokens)
        p = torch.nn.functional.one_hot(best, vocab).float()  # [n + 1, vocab]
        q = normalised(torch.rand(len(tree) + 1, vocab, generator=gen))  # [n + 1, vocab]
        expected = greedy_tree_accept(tree, logits)
        for q_rows, replacement in ((q, True), (q, False), (None, True)):
            assert tree_rejection_accept(tree, p, q_rows, gen, replacement) == expected


def test_draft_equal_to_target_accepts_a_full_path():
    """q == p: the first child of every node is accepted, so the walk follows first children to a leaf."""
    gen = torch.Generator().manual_seed(3)
    tree = make_tree(BRANCHING, [0, 1, 2, 3, 0, 1])
    for _ in range(200):
        p = normalised(torch.rand(7, 4, generator=gen))  # [n + 1, vocab]
        assert tree_rejection_accept(tree, p, p.clone(), gen, False).path == [0, 2, 5]


def test_repeated_deterministic_sibling_is_never_accepted():
    tree = make_tree([-1, -1], [2, 2])
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25] * 4, [0.25] * 4])  # [n + 1, vocab]
    gen = torch.Generator().manual_seed(4)
    paths = [tree_rejection_accept(tree, p, None, gen, False).path for _ in range(300)]
    assert [1] not in paths and [0] in paths and [] in paths


def test_same_seed_same_output_and_bad_shapes():
    tree = make_tree(BRANCHING, [0, 1, 2, 3, 0, 1])
    p = normalised(torch.rand(7, 4, generator=torch.Generator().manual_seed(5)))  # [n + 1, vocab]
    q = normalised(torch.rand(7, 4, generator=torch.Generator().manual_seed(6)))  # [n + 1, vocab]
    runs = [[tree_rejection_accept(tree, p, q, gen, True) for _ in range(30)]
            for gen in (torch.Generator().manual_seed(s) for s in (8, 8, 9))]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    with pytest.raises(ValueError, match="n \\+ 1"):
        tree_rejection_accept(tree, p[:6], q, torch.Generator(), True)
    with pytest.raises(ValueError, match="parent_q"):
        tree_rejection_accept(tree, p, q[:6], torch.Generator(), True)
    with pytest.raises(ValueError):
        greedy_tree_accept(tree, p[:6])


# ---------------------------------------------------------------- tree_rejection_accept: distributions
#
# Vocab 4. The target's and the draft's next-token distributions depend on the whole token path
# (a seeded hash of it picks a Dirichlet(1) draw, and every other path gets one token zeroed), so
# conditional structure, zeros in p and zeros in q are all exercised. Each trial samples a depth-2
# tree from the draft, verifies it, and continues the emitted text with exact target samples up to
# 3 tokens; the joint of the first 2 and of the first 3 tokens must match the exact target joint.

V = 4
N = 20_000
DELTA = 1e-4
SAMPLED = [-1, -1, -1, 0, 0, 1, 1, 2, 2]  # 3 children at the root, 2 under each
FIXED = [-1, -1, 0, 0, 1, 1]  # 2 deterministic children per node


def path_dist(path: tuple[int, ...], salt: int) -> torch.Tensor:
    """A fixed distribution # [V] for a token path: Dirichlet(1) seeded by (salt, path)."""
    code = sum((t + 1) * (V + 1) ** i for i, t in enumerate(path))
    gen = torch.Generator().manual_seed(1_000_003 * salt + code)
    weights = torch.empty(V).exponential_(generator=gen)  # [V]
    if code % 2:
        weights[(code + salt) % V] = 0.0
    return weights / weights.sum()


def dist_tables(salt: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Next-token distributions after paths of length 0, 1, 2: # [V], [V, V], [V, V, V]."""
    t0 = path_dist((), salt)
    t1 = torch.stack([path_dist((a,), salt) for a in range(V)])
    t2 = torch.stack([torch.stack([path_dist((a, b), salt) for b in range(V)]) for a in range(V)])
    return t0, t1, t2


P0, P1, P2 = dist_tables(salt=1)
Q0, Q1, _ = dist_tables(salt=2)
JOINT3 = P0[:, None, None] * P1[:, :, None] * P2  # [V, V, V] exact target joint of 3 tokens
JOINT2 = JOINT3.sum(-1)  # [V, V]


def tv_bound(cells: int, num: int = N, delta: float = DELTA) -> float:
    """TV(empirical, true) over `cells` outcomes from num iid draws exceeds this with prob < delta.

    E[TV] <= 0.5 * sqrt(cells / num) (Jensen, Cauchy-Schwarz); one draw moves TV by <= 1 / num, so
    McDiarmid adds sqrt(ln(1 / delta) / (2 num)).
    """
    return 0.5 * math.sqrt(cells / num) + math.sqrt(math.log(1 / delta) / (2 * num))


def draw_children(q: torch.Tensor, m: int, replacement: bool, gen: torch.Generator) -> torch.Tensor:
    """m children per row of q # [N, V] -> # [N, m]: i.i.d., or one at a time with drawn tokens removed."""
    if replacement:
        return torch.multinomial(q, m, replacement=True, generator=gen)
    q, out = q.clone(), []
    for _ in range(m):
        out.append(torch.multinomial(q, 1, generator=gen).squeeze(1))  # [N]
        q = normalised(q.scatter(1, out[-1].unsqueeze(1), 0.0))
    return torch.stack(out, dim=1)


def sampled_trees(replacement: bool, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """N depth-2 trees drawn from the draft: tokens # [N, 9], p rows # [N, 10, V], q rows # [N, 10, V]."""
    gen = torch.Generator().manual_seed(seed)
    top = draw_children(Q0.expand(N, V), 3, replacement, gen)  # [N, 3]
    below = [draw_children(Q1[top[:, c]], 2, replacement, gen) for c in range(3)]  # 3 x [N, 2]
    tokens = torch.cat([top] + below, dim=1)  # [N, 9]
    p_rows = [P0.expand(N, V)] + [P1[top[:, c]] for c in range(3)]
    p_rows += [P2[top[:, c], below[c][:, j]] for c in range(3) for j in range(2)]
    q_rows = [Q0.expand(N, V)] + [Q1[top[:, c]] for c in range(3)] + [torch.zeros(N, V)] * 6
    return tokens, torch.stack(p_rows, dim=1), torch.stack(q_rows, dim=1)


def fixed_tree() -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic candidates: the draft's top-2 tokens at each node. tokens # [6], p rows # [7, V]."""
    top = Q0.topk(2).indices  # [2]
    below = Q1[top].topk(2, dim=-1).indices  # [2, 2]
    tokens = torch.cat([top, below.flatten()])  # [6]
    p_rows = torch.stack([P0, P1[top[0]], P1[top[1]]] + [P2[top[c], below[c, j]] for c in range(2) for j in range(2)])
    return tokens, p_rows


def run_trials(verify, parents: list[int], tokens: torch.Tensor, p_rows: torch.Tensor, q_rows: torch.Tensor | None,
               replacement: bool, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify one tree per trial. tokens # [N, n], p_rows # [N, n + 1, V], q_rows likewise or None.
    Returns (first-child accepted # [N] bool, first 3 emitted tokens # [N, 3], -1 past the emitted ones)."""
    gen = torch.Generator().manual_seed(seed)
    parents_t = torch.tensor(parents)
    first, emitted = [], []
    for t in range(tokens.shape[0]):
        tree = DraftTree(tokens[t], parents_t)
        path, token = verify(tree, p_rows[t], None if q_rows is None else q_rows[t], gen, replacement)
        first.append(path[:1] == [0])
        emitted.append((tokens[t, path].tolist() + [token] + [-1, -1])[:3])
    return torch.tensor(first), torch.tensor(emitted)


def continue_with_target(emitted: torch.Tensor, seed: int = 2) -> torch.Tensor:
    """Fill the -1 slots of emitted # [N, 3] by sampling the target given the tokens before them."""
    gen = torch.Generator().manual_seed(seed)
    out = emitted.clone()
    second = torch.multinomial(P1[out[:, 0]], 1, generator=gen).squeeze(1)  # [N]
    out[:, 1] = torch.where(out[:, 1] < 0, second, out[:, 1])
    third = torch.multinomial(P2[out[:, 0], out[:, 1]], 1, generator=gen).squeeze(1)  # [N]
    out[:, 2] = torch.where(out[:, 2] < 0, third, out[:, 2])
    return out


def assert_follows_target(emitted: torch.Tensor) -> None:
    """emitted # [N, 3] (first token always present): joints of 2 and 3 tokens within the TV bound."""
    assert bool((emitted[:, 0] >= 0).all())
    full = continue_with_target(emitted)
    codes = full[:, 0] * V * V + full[:, 1] * V + full[:, 2]  # [N]
    freq3 = torch.bincount(codes, minlength=V ** 3).float().view(V, V, V) / full.shape[0]  # [V, V, V]
    for k, freq, exact in ((2, freq3.sum(-1), JOINT2), (3, freq3, JOINT3)):
        tv, bound = 0.5 * (freq - exact).abs().sum().item(), tv_bound(exact.numel(), full.shape[0])
        assert tv < bound, f"first {k} tokens: TV {tv:.4f} >= bound {bound:.4f}"


def assert_rate(flags: torch.Tensor, expected: float) -> None:
    """A verifier that rejects too often still emits p; the first child's accept rate catches that (Hoeffding)."""
    rate = flags.float().mean().item()
    assert abs(rate - expected) < math.sqrt(math.log(2 / DELTA) / (2 * flags.numel())), f"{rate:.4f} vs {expected:.4f}"


def test_tables_are_far_apart_and_have_zeros():
    assert bool((P1 == 0).any()) and bool((Q1 == 0).any())
    assert 0.5 * (P0 - Q0).abs().sum().item() > 0.2
    assert JOINT3.sum().item() == pytest.approx(1.0)


@pytest.mark.parametrize("replacement", [True, False], ids=["with_replacement", "without_replacement"])
def test_sampled_tree_emits_target_joint(replacement):
    tokens, p_rows, q_rows = sampled_trees(replacement)
    first, emitted = run_trials(tree_rejection_accept, SAMPLED, tokens, p_rows, q_rows, replacement)
    assert_follows_target(emitted)
    assert_rate(first, torch.minimum(P0, Q0).sum().item())  # the first child ~ Q0 is tried against P0
    lengths = (emitted >= 0).sum(1)  # [N]
    assert {1, 2, 3} <= set(lengths.tolist())


def test_deterministic_siblings_emit_target_joint():
    tokens, p_rows = fixed_tree()
    assert tokens[0] != tokens[1] and tokens[2] != tokens[3] and tokens[4] != tokens[5]
    first, emitted = run_trials(tree_rejection_accept, FIXED, tokens.expand(N, 6), p_rows.expand(N, 7, V), None,
                                replacement=False)
    assert_follows_target(emitted)
    assert_rate(first, P0[tokens[0]].item())
    # Either root child: probability p[x_1] + (1 - p[x_1]) * p[x_2] / (1 - p[x_1]) = p[x_1] + p[x_2].
    assert_rate(emitted[:, 0] == tokens[0], P0[tokens[0]].item())
    assert_rate((emitted[:, 1] >= 0), P0[tokens[:2]].sum().item())


def accept_every_draft(tree: DraftTree, p: torch.Tensor, q: torch.Tensor | None, gen: torch.Generator,
                       replacement: bool) -> TreeAcceptance:
    """WRONG on purpose: follows the first child down to a leaf and draws the bonus from its row."""
    path, node = [], -1
    while children := tree.children(node):
        node = children[0]
        path.append(node)
    return TreeAcceptance(path, int(torch.multinomial(p[node + 1], 1, generator=gen)))


def test_tv_check_rejects_accepting_every_draft():
    tokens, p_rows, q_rows = sampled_trees(replacement=True)
    _, emitted = run_trials(accept_every_draft, SAMPLED, tokens, p_rows, q_rows, True)
    with pytest.raises(AssertionError, match="first 2 tokens"):
        assert_follows_target(emitted)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_runs_and_matches_cpu_greedy():
    tree = make_tree(BRANCHING, [5, 3, 1, 2, 7, 6])
    logits = logits_with_argmax([3, 0, 7, 0, 0, 2, 0])  # [n + 1, vocab]
    assert greedy_tree_accept(tree, logits.cuda()) == greedy_tree_accept(tree, logits) == ([1, 4], 2)
    p = torch.softmax(logits.cuda(), -1)  # [n + 1, vocab] on CUDA
    gen = torch.Generator(device="cuda").manual_seed(0)
    path, token = tree_rejection_accept(tree, p, p.clone(), gen, False)
    assert path == [0, 2, 5] and 0 <= token < 8
    assert tree_rejection_accept(tree, p, None, gen, True).next_token in range(8)
