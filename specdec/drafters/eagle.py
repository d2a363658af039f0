"""EAGLE: a one-layer head drafting from the target's own features (specdec.training trains it).

The head's entry at index t reads [the embedding of token t + 1; the target's feature at position t]
(its final norm's output) and predicts the feature at t + 1 and the token after t + 1. The target's
prefill and every verify hand their rows' features to the drafter (`feed`, caps.features), so no
extra target forward is run: after a step the features of every committed token but the last are
known, and the head's next proposal feeds the entries it has not seen, the last of which proposes
the first draft token. Later draft tokens are drafted on the head's own predicted features.

The head keeps its own one-layer KV cache, cut back before each proposal to the entries built from
true features and committed tokens. Its LM head is the target's, cut to the draft vocabulary (d2t);
a draft token's q is the head's distribution over that vocabulary, zero elsewhere, processed with
the request's sampling settings, so rejection sampling stays exact.

On the CPU backend the head's linear layers run on 8-bit blocks (Q8_0) through the target's kernels,
and its LM head on the target's own blocks for the draft vocabulary's rows (specdec.heads.prepared).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec.config import TreeConfig
from specdec.drafters.base import END, GO_ON, LAST, BaseDrafter, Capabilities, DraftState
from specdec.drafters.device_chain import (chain_samplings, device_chains, draft_chain, draw_uniforms, pool_chains,
                                           stop_cut)
from specdec.drafters.draft_model import node_depths, select_tree, tree_sizes
from specdec.drafters.registry import Entry
from specdec.errors import SpecdecError
from specdec.heads.prepared import PreparedHead, PreparedMedusa
from specdec.model.kv_cache import KVCache
from specdec.model.transformer import Ragged, Static, Transformer, causal_mask, rope_tables
from specdec.sampling.logits import probs_from_logits, sample
from specdec.tree import DraftTree, choices_to_parents


class TreeNodes(NamedTuple):
    """A head's candidate tree before select_tree: tokens, parents (-1: the root's), cumulative
    log-probabilities, each # [topk + (depth - 1) topk^2], level by level, children in rank order."""

    tokens: torch.Tensor
    parents: torch.Tensor
    scores: torch.Tensor


class EagleDrafter(BaseDrafter):
    """Chains of k tokens from an EAGLE head (specdec.heads.modules.EagleHead, or a PreparedHead) for its target."""

    def __init__(self, target: Transformer, head, capacity: int, tree: TreeConfig | None = None,
                 on_device: bool | None = None):
        """tree: draft dynamic token trees (EAGLE-2: top-k expansion by cumulative draft probability,
        re-ranked to the node budget) instead of chains; static choices are not taken. on_device: draft
        chains on the device, one host sync a chain (device_chain.py; default: where the target replays
        CUDA graphs, and then as one graph)."""
        if tree is not None and tree.choices is not None:
            raise SpecdecError("the EAGLE drafter drafts dynamic trees (--tree-budget); static --tree-choices "
                               "are for a draft model")
        self.target = target
        self.tree = tree
        # chains: a server's pool drafts every row's chain together (propose_head_chains)
        self.caps = Capabilities(features=True, knows_confidence=True, tree_nodes=0 if tree is None else tree.budget,
                                 pooled=tree is None)
        self.pool_model = self if tree is None else None
        p = self.prepared = head if isinstance(head, PreparedHead) else PreparedHead(target, head)
        cfg = p.config
        device = target.device
        self.ids, self.lm, self.fc, self.layer = p.ids, p.lm, p.fc, p.layer
        self.capacity = capacity  # RoPE positions past the head's training length are the target's own
        if p.rope_cos.shape[0] < capacity:
            p.rope_cos, p.rope_sin = (t.to(device) for t in rope_tables(cfg.layer_config(), capacity))
        self.cache = KVCache(1, cfg.num_kv_heads, cfg.head_dim, self.capacity, 1, torch.float32, device)
        self.features = torch.zeros(capacity, cfg.hidden_size, device=device)  # the target's, by position
        self.valid = 0  # head entries built from true features and committed tokens (indices 0..valid-1)
        self.chains = device_chains(target.graphs is not None, on_device)

    def tree_actions(self) -> dict:
        budget = self.caps.tree_nodes
        return {"tree_sizes": tree_sizes(budget), "tree_depth": self.tree.depth} if budget >= 2 else {}

    def start(self, prompt: list[int]) -> None:
        self.cache.reset()
        self.valid = 0

    def new_pool_cache(self, batch: int) -> KVCache:
        """A head cache of `batch` rows; a pool gives each of its drafters one row as `cache`."""
        cfg = self.prepared.config
        return KVCache(1, cfg.num_kv_heads, cfg.head_dim, self.capacity, batch, torch.float32, self.features.device)

    @staticmethod
    def propose_pooled(drafters: list["EagleDrafter"], states: list[DraftState], cache: KVCache,
                       rows: list[int]) -> list[DraftTree]:
        return propose_head_chains(drafters, states, cache, rows)

    def entry(self, context: int = 256):
        """One head entry (one draft token) at `context` cached entries, as a callable (it writes the
        head's cache there: start() the drafter afresh after timing it)."""
        device = self.features.device
        start = min(context, self.capacity - 1)
        feature = torch.zeros(1, self.prepared.config.hidden_size, device=device)
        token = torch.zeros(1, dtype=torch.long, device=device)
        return lambda: self._run(feature, token, start)

    def rows_entry(self, rows: int, context: int = 256):
        """One pooled head entry over `rows` rows of a pool's cache at `context` entries, as a callable."""
        cache, device = self.new_pool_cache(rows), self.features.device
        at, feature = min(context, self.capacity - 1), torch.zeros(1, self.prepared.config.hidden_size, device=device)
        feeds = [(feature, [0], at)] * rows
        return lambda: _ragged_entries(self.prepared, self.target, feeds, cache, list(range(rows)), device)

    def feed(self, position: int, features: torch.Tensor) -> None:
        """The target's features # [n, hidden] of positions position..position+n-1."""
        n = features.shape[0]
        self.features[position:position + n] = features.float()

    @torch.inference_mode()
    def _run(self, features: torch.Tensor, tokens: torch.Tensor, start: int, positions: torch.Tensor | None = None,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Head entries at cache slots start.. (RoPE positions start.., or `positions` # [n] under `mask`
        # [n, start + n]) for features # [n, hidden] and the next tokens # [n] -> (predicted features
        # [n, hidden], draft-vocabulary logits # [n, draft_vocab]); writes its cache there."""
        n = features.shape[0]
        emb = self.target.embed(tokens.view(1, n)).float()  # [1, n, hidden] (Gemma's scaled, as its layers see them)
        x = self.fc(torch.cat([emb, features.view(1, n, -1)], dim=-1))  # [1, n, hidden]
        pos = torch.arange(start, start + n, device=x.device) if positions is None else positions
        p = self.prepared
        cos = p.rope_cos[pos][None, None]  # [1, 1, n, head_dim]
        sin = p.rope_sin[pos][None, None]
        x = self.layer(x, cos, sin, self.cache.k[0], self.cache.v[0], start,
                       causal_mask(start, n, x.device) if mask is None else mask)
        return p.predict(x[0])

    def _q(self, logits: torch.Tensor, state: DraftState) -> torch.Tensor | None:
        """The draft distribution # [vocab] of draft-vocabulary logits # [draft_vocab] (None under greedy)."""
        if state.sampling.greedy:
            return None
        full = torch.full((self.target.config.vocab_size,), float("-inf"), device=logits.device)
        full[self.ids] = logits
        return probs_from_logits(full, state.sampling)

    def masked(self, logits: torch.Tensor, state: DraftState, drafted: list) -> torch.Tensor | None:
        """Draft-vocabulary logits # [draft_vocab] as the head drafts from them: the request's penalties
        after the tokens drafted so far (as the target's row there has them), and under a grammar its
        mask there; None where the grammar allows none of the head's ids (or is over): the chain ends there."""
        drafted = [int(t) for t in drafted]
        if state.penalize is not None:
            logits = state.penalize(self._full(logits), drafted)[self.ids]
        if state.mask is None:
            return logits
        allowed = state.mask(drafted)  # [vocab]
        if allowed is None:
            return None
        keep = allowed.to(logits.device)[self.ids]  # [draft_vocab]
        return logits.masked_fill(~keep, float("-inf")) if keep.any() else None

    def propose(self, state: DraftState) -> DraftTree:
        tokens = state.tokens
        n = len(tokens)
        if state.k < 1 or n < 2 or n >= self.capacity:
            return DraftTree.empty()
        # entries 0..m-1 still hold; feed indices m..n-2 (at least the last: its output drafts token 1)
        m = min(self.valid, n - 2, self.cache.length)
        self.cache.truncate(m)
        device = self.features.device
        t = torch.tensor(tokens[m + 1:n], dtype=torch.long, device=device)
        # a device chain's first slot, by a fill: on a GPU a tensor copied from the host waits for queued work
        start = None if self.chains is None else torch.full((), n - 1, dtype=torch.long, device=device)
        pred, logits = self._run(self.features[m:n - 1], t, m)
        self.cache.length = self.valid = n - 1
        if self.tree is not None and state.tree:
            scratch = (min(self.tree.depth, state.k) - 1) * self.tree.topk  # the device tree's entries
            if self.chains is not None and n - 1 + scratch <= self.capacity:
                return self._device_tree(state, pred[-1], logits[-1], start)
            return self._dynamic_tree(state, pred[-1], logits[-1], n)
        limit = min(state.limit, self.capacity - n)
        if self.chains is not None and state.mask is None and limit >= 1:  # a grammar's masks need the host
            return self._propose_on_device(state, pred[-1:], logits[-1], start, limit)
        drafted, qs = [], []
        for i in range(limit):
            row = self.masked(logits[-1], state, drafted)  # [draft_vocab]
            if row is None:
                break
            q = self._q(row, state)
            decision = GO_ON if state.stop is None else state.stop(i, self._top(row, q))
            if decision == END:
                break
            token = self.ids[row.argmax()] if q is None else sample(q, state.generator)
            drafted.append(token.view(1))
            qs.append(q)
            if decision == LAST or i + 1 == limit:
                break
            pred, logits = self._run(pred[-1:], token.view(1), n - 1 + i)  # the head's own feature and this token
            self.cache.length = n + i
        if not drafted:
            return DraftTree.empty()
        return DraftTree.chain(torch.cat(drafted), None if state.sampling.greedy else torch.stack(qs))

    @torch.inference_mode()
    def _propose_on_device(self, state: DraftState, pred: torch.Tensor, logits: torch.Tensor, start: torch.Tensor,
                           limit: int) -> DraftTree:
        """propose()'s chain drafted on the device to its limit from the last true entry's predicted feature
        # [1, hidden] and logits # [draft_vocab], its first slot start (0-dim: the committed tokens' count - 1),
        then cut by the confidence rule (device_chain.py)."""
        device, rules, samplings = logits.device, state.stop is not None, chain_samplings([state.sampling])
        uniforms = draw_uniforms([limit], samplings, [state.generator], limit, device)
        chain = self.chains.run(self.cache, (limit, samplings, rules), lambda lg, p, st, u: draft_chain(
            self._head_step(p), lg, st, u, limit, samplings, rules), (self._full(logits[None]), pred, start.view(1),
                                                                     uniforms))
        self.cache.length = self.valid + limit - 1  # the chain fed all but its last token, at slots valid..
        cut = stop_cut(chain.top[0].tolist(), limit, state.stop) if rules else limit
        if cut == 0:
            return DraftTree.empty()
        return DraftTree.chain(*chain.row(0, cut, state.sampling.greedy))

    def _head_step(self, pred: torch.Tensor, cache: KVCache | None = None, rows: torch.Tensor | None = None):
        """draft_chain's step for the head: each row's entry at its slot on the feature it predicted last (pred
        # [B, hidden] to begin with) and the token drafted from it; the logits over the target's vocabulary
        # [B, vocab]. In its own cache (B = 1), or at rows # [B] of a pool's batched one. Only device
        operations (the entry writes at slots, attends under a mask over the head cache's capacity)."""
        p, every, last = self.prepared, torch.arange(self.capacity, device=pred.device), [pred]
        cache = self.cache if cache is None else cache

        def step(tokens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
            emb = self.target.embed(tokens[:, None]).float()  # [B, 1, hidden]
            x = self.fc(torch.cat([emb, last[0][:, None]], dim=-1))
            cos, sin = p.rope_cos[slots][:, None, None], p.rope_sin[slots][:, None, None]  # [B, 1, 1, head_dim]
            seen = every[None, :] <= slots[:, None]  # [B, capacity]
            where, mask = (Static(slots), seen) if rows is None else (Ragged(rows, slots[:, None]),
                                                                      seen[:, None, None, :])
            x = self.layer(x, cos, sin, cache.k[0], cache.v[0], where, mask)
            last[0], logits = p.predict(x[:, 0])  # [B, hidden], [B, draft_vocab]
            return self._full(logits)
        return step

    def _full(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits # [..., draft_vocab] over the target's vocabulary # [..., vocab] (-inf off the
        draft's): its argmax is the host loop's token, its processed softmax the host loop's q."""
        full = torch.full((*logits.shape[:-1], self.target.config.vocab_size), float("-inf"), device=logits.device)
        return full.index_copy(-1, self.ids, logits.float())

    def _dynamic_tree(self, state: DraftState, root_feature: torch.Tensor, root_logits: torch.Tensor,
                      n: int) -> DraftTree:
        """EAGLE-2: the topk best nodes of each depth (by cumulative log-probability) are fed, each on
        its parent's predicted feature, in one head pass per depth under a tree mask; their topk
        children are the next candidates; the best `budget` nodes make the tree (q = None: the tree
        verifier samples without replacement among deterministic candidates)."""
        cfg = self.tree
        budget = min(cfg.budget, state.max_nodes if state.max_nodes is not None else cfg.budget)
        depth = min(cfg.depth, state.k)
        tokens, parents, scores, depths, slots, feature = [], [], [], [], {}, {}
        values, ids = torch.log_softmax(root_logits, -1).topk(min(cfg.topk, root_logits.shape[-1]))
        frontier = []
        for v, i in zip(values.tolist(), ids.tolist()):
            frontier.append(len(tokens))
            tokens.append(int(self.ids[i])), parents.append(-1), scores.append(v), depths.append(1)
        for d in range(2, depth + 1):
            frontier = sorted(frontier, key=lambda x: -scores[x])[:cfg.topk]
            feats = torch.stack([root_feature if parents[x] < 0 else feature[parents[x]] for x in frontier])
            preds, logits = self._expand(frontier, feats, tokens, parents, slots, n)
            values, ids = torch.log_softmax(logits, -1).topk(min(cfg.topk, logits.shape[-1]), dim=-1)
            new = []
            for row, node in enumerate(frontier):
                feature[node] = preds[row]
                for v, i in zip(values[row].tolist(), ids[row].tolist()):
                    new.append(len(tokens))
                    tokens.append(int(self.ids[i])), parents.append(node), scores.append(scores[node] + v)
                    depths.append(d)
            frontier = new
        self.cache.truncate(n - 1)  # the tree's entries were scratch
        return select_tree(tokens, parents, scores, depths, budget, root_logits.device)

    @torch.inference_mode()
    def _device_tree(self, state: DraftState, root_feature: torch.Tensor, root_logits: torch.Tensor,
                     start: torch.Tensor) -> DraftTree:
        """_dynamic_tree with every level on the device (tree_levels; one CUDA graph a (depth, topk) where
        the target replays graphs) and one host read at the end, for the same nodes and the same tree."""
        cfg = self.tree
        budget = min(cfg.budget, state.max_nodes if state.max_nodes is not None else cfg.budget)
        depth, k = min(cfg.depth, state.k), min(cfg.topk, root_logits.shape[-1])
        out = self.chains.run(self.cache, ("tree", depth, k),
                              lambda f, lg, start: self.tree_levels(f, lg, start, depth, k),
                              (root_feature, root_logits, start))
        depths = [1] * k + [d for d in range(2, depth + 1) for _ in range(k * k)]
        return select_tree(out.tokens.tolist(), out.parents.tolist(), out.scores.tolist(), depths, budget,
                           root_logits.device)

    def tree_levels(self, root_feature: torch.Tensor, root_logits: torch.Tensor, start: torch.Tensor, depth: int,
                    k: int) -> TreeNodes:
        """_dynamic_tree's candidate nodes, device operations only: the root's k best children, then at each
        depth the k best new nodes (by cumulative log-probability) fed in one head pass, each on its
        parent's predicted feature, at slots start + (depth - 2) k + row, seeing the committed entries (the
        start first: a 0-dim int64 tensor), its ancestors' and its own; each gives its k best children. The
        root's children sit at RoPE position start, their children at start + 1, ... The cache's length is
        not moved (the entries are scratch)."""
        p, device = self.prepared, root_logits.device
        every = torch.arange(self.capacity, device=device)
        values, ids = torch.log_softmax(root_logits, -1).topk(k)  # [k]
        tokens, parents, scores = [self.ids[ids]], [torch.full((k,), -1, device=device)], [values]
        rows = torch.arange(k, device=device)
        frontier, feats, base = rows, root_feature.expand(k, -1), 0  # node indices, their inputs' features
        seen = (every < start).expand(k, -1)  # [k, capacity]: what each frontier node's entry sees
        for d in range(2, depth + 1):
            slots = start + (d - 2) * k + rows  # [k]
            seen = seen | (every[None, :] == slots[:, None])
            emb = self.target.embed(torch.cat(tokens)[frontier][None]).float()  # [1, k, hidden]
            x = self.fc(torch.cat([emb, feats[None].float()], dim=-1))
            pos = (start + d - 2).expand(k)  # [k]
            x = self.layer(x, p.rope_cos[pos][None, None], p.rope_sin[pos][None, None], self.cache.k[0],
                           self.cache.v[0], Static(slots), seen)
            preds, logits = p.predict(x[0])  # [k, hidden], [k, draft_vocab]
            values, ids = torch.log_softmax(logits, -1).topk(k, dim=-1)  # [k, k]
            base += len(scores[-1]) if d > 2 else k
            tokens.append(self.ids[ids].flatten())
            parents.append(frontier[:, None].expand(k, k).flatten())  # each frontier node k times (no host sync)
            scores.append((torch.cat(scores)[frontier][:, None] + values).flatten())
            if d < depth:  # the next frontier: the k best new nodes, each with its parent's row's feature and view
                best = scores[-1].topk(k).indices  # [k], best first
                frontier, feats, seen = base + best, preds[best // k], seen[best // k]
        return TreeNodes(torch.cat(tokens), torch.cat(parents), torch.cat(scores))

    def _expand(self, nodes: list[int], feats: torch.Tensor, tokens: list[int], parents: list[int],
                slots: dict[int, int], n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One head pass over `nodes` (their ancestors' entries are in the cache, at `slots`): each sees
        the committed entries, its ancestors' and its own, at position n - 2 + its depth."""
        device = self.features.device
        start, m = self.cache.length, len(nodes)
        if start + m > self.capacity:
            raise SpecdecError(f"the head's cache of {self.capacity} entries has no room for a tree level of {m}")
        mask = torch.zeros(m, start + m, dtype=torch.bool, device=device)
        mask[:, :n - 1] = True
        positions = []
        for row, node in enumerate(nodes):
            a, chain = parents[node], 1
            while a >= 0:
                mask[row, slots[a]] = True
                a, chain = parents[a], chain + 1
            mask[row, start + row] = True
            slots[node] = start + row
            positions.append(n - 2 + chain)
        out = self._run(feats, torch.tensor([tokens[x] for x in nodes], dtype=torch.long, device=device), start,
                        torch.tensor(positions, device=device), mask)
        self.cache.length = start + m
        return out

    @staticmethod
    def _top(logits: torch.Tensor, q: torch.Tensor | None) -> float:
        """The draft's top probability: of q, or of the raw softmax under greedy (the confidence rule's input)."""
        return float((torch.softmax(logits, -1) if q is None else q).max())


@torch.inference_mode()
def propose_head_chains(drafters: list[EagleDrafter], states: list[DraftState], cache: KVCache,
                        rows: list[int]) -> list[DraftTree]:
    """EagleDrafter.propose for many rows together: one head forward per draft position over every
    row still drafting (the first one ragged: each row feeds the entries it has not seen), so a round
    of B rows reads the head's weights once per position, not B times. The drafters' caches must be
    rows `rows` of `cache` and share one head (the first one's prepared layers draft for all); each
    row drafts as propose() would, with its own sampling, generator and confidence rule."""
    if not drafters:
        return []
    p = drafters[0].prepared
    if any(d.prepared.head is not p.head or d.tree is not None for d in drafters):
        raise SpecdecError("pooled head drafting needs chain drafters sharing one head")
    device, n = cache.k.device, len(drafters)
    drafted: list[list[torch.Tensor]] = [[] for _ in range(n)]
    qs: list[list] = [[] for _ in range(n)]
    live, feeds = [], []  # feeds[j]: (features # [m, hidden], the next tokens [m], the first slot)
    for i, (d, state) in enumerate(zip(drafters, states)):
        length = len(state.tokens)
        if state.k < 1 or length < 2 or length >= d.capacity:
            continue
        m = min(d.valid, length - 2, d.cache.length)  # as propose(): entries 0..m-1 still hold
        d.cache.truncate(m)
        live.append(i)
        feeds.append((d.features[m:length - 1], state.tokens[m + 1:length], m))
    limits = {i: min(states[i].limit, drafters[i].capacity - len(states[i].tokens)) for i in live}
    widest = max(limits.values(), default=0)
    if widest >= 1 and all(drafters[i].chains is not None and states[i].mask is None
                           and len(states[i].tokens) + widest - 2 <= drafters[i].capacity for i in live):
        return _head_rows_on_device(drafters, states, cache, rows, live, feeds, limits)
    first = True
    while live:
        preds, logits = _ragged_entries(p, drafters[0].target, feeds, cache, [rows[i] for i in live], device)
        nxt, next_feeds = [], []
        for j, i in enumerate(live):
            d, state = drafters[i], states[i]
            _, fed, start = feeds[j]
            last, done = len(fed) - 1, len(drafted[i])
            d.cache.length = start + len(fed)
            if first:
                d.valid = d.cache.length
            limit = min(state.limit, d.capacity - len(state.tokens))
            if done >= limit:
                continue
            row = d.masked(logits[j, last], state, drafted[i])  # [draft_vocab]
            if row is None:
                continue
            q = d._q(row, state)
            decision = GO_ON if state.stop is None else state.stop(done, d._top(row, q))
            if decision == END:
                continue
            token = d.ids[row.argmax()] if q is None else sample(q, state.generator)
            drafted[i].append(token.view(1))
            qs[i].append(q)
            if decision != LAST and done + 1 < limit:  # next: the head's own feature and this token
                nxt.append(i)
                next_feeds.append((preds[j, last:last + 1], [int(token)], d.cache.length))
        live, feeds, first = nxt, next_feeds, False
    return [DraftTree.chain(torch.cat(t), None if s.sampling.greedy else torch.stack(q)) if t else DraftTree.empty()
            for t, q, s in zip(drafted, qs, states)]


def _head_rows_on_device(drafters: list[EagleDrafter], states: list[DraftState], cache: KVCache, rows: list[int],
                         live: list[int], feeds: list, limits: dict[int, int]) -> list[DraftTree]:
    """propose_head_chains on the device: the ragged feed, then every live row's chain to the longest limit
    among them (one graph under CUDA graphs, device_chain.py), one host read, then each row cut to its own
    limit and confidence rule."""
    head, device = drafters[live[0]], cache.k.device
    # the chain's inputs before the feed: on a GPU, a tensor made from the host's values waits for queued work
    at, last = torch.arange(len(live), device=device), torch.tensor([len(f) - 1 for _, f, _ in feeds], device=device)
    limit = max(limits.values())
    samplings = chain_samplings(states[i].sampling for i in live)
    rules = any(states[i].stop is not None for i in live)
    uniforms = draw_uniforms([limits[i] for i in live], samplings, [states[i].generator for i in live], limit,
                             device)
    starts = torch.tensor([len(states[i].tokens) - 1 for i in live], device=device)  # each row's first chain slot
    where = torch.tensor([rows[i] for i in live], device=device)
    preds, logits = _ragged_entries(head.prepared, head.target, feeds, cache, [rows[i] for i in live], device)
    chain = pool_chains(cache, head.chains.graphed).run(
        cache, ("head rows", len(live), limit, samplings, rules),
        lambda lg, pred, start, r, u: draft_chain(head._head_step(pred, cache, r), lg, start, u, limit, samplings,
                                                  rules),
        (head._full(logits[at, last]), preds[at, last], starts, where, uniforms))
    top = chain.top.tolist() if rules else None
    out = [DraftTree.empty() for _ in drafters]
    for j, i in enumerate(live):
        d, state, n = drafters[i], states[i], len(states[i].tokens)
        d.valid, d.cache.length = n - 1, n + limit - 2  # true entries, then the chain's scratch ones
        cut = limits[i] if state.stop is None else stop_cut(top[j], limits[i], state.stop)
        if cut:
            out[i] = DraftTree.chain(*chain.row(j, cut, state.sampling.greedy))
    return out


def _ragged_entries(p: PreparedHead, target: Transformer, feeds: list, cache: KVCache, rows: list[int],
                    device) -> tuple[torch.Tensor, torch.Tensor]:
    """Head entries of several cache rows in one forward: row j feeds features # [m_j, hidden] with the
    next tokens at slots (and RoPE positions) start_j..start_j + m_j - 1; a shorter row repeats its
    last entry (the same keys and values, written to the same slot twice). -> (predicted features
    # [B, T, hidden], draft-vocabulary logits # [B, T, draft_vocab])."""
    width = max(len(fed) for _, fed, _ in feeds)
    index = [[min(c, len(fed) - 1) for c in range(width)] for _, fed, _ in feeds]
    tokens = torch.tensor([[fed[c] for c in ix] for (_, fed, _), ix in zip(feeds, index)], device=device)  # [B, T]
    feats = torch.stack([f[torch.tensor(ix, device=device)] for (f, _, _), ix in zip(feeds, index)]).float()
    at = [[start + c for c in ix] for (_, _, start), ix in zip(feeds, index)]
    slots = torch.tensor(at, device=device)  # [B, T]
    span = max(max(r) for r in at) + 1  # the last slot + 1, known on the host (no read back from the device)
    mask = (torch.arange(span, device=device)[None, None, :] <= slots[:, :, None]).unsqueeze(1)
    x = p.fc(torch.cat([target.embed(tokens).float(), feats], dim=-1))  # [B, T, hidden]
    cos, sin = p.rope_cos[slots].unsqueeze(1), p.rope_sin[slots].unsqueeze(1)  # [B, 1, T, head_dim]
    x = p.layer(x, cos, sin, cache.k[0], cache.v[0], Ragged(torch.tensor(rows, device=device), slots), mask)
    return p.predict(x)


class MedusaDrafter(BaseDrafter):
    """Medusa: head i reads the target's feature at the last fed position (the token before the last
    committed one) and proposes the token i + 1 after the last committed one. Chains take each
    head's top token (its distribution as q when sampling: a chain's q may ignore the tokens before
    it); a static tree (`choices`, rank paths) takes each head's top ranks (q = None)."""

    def __init__(self, target: Transformer, head, capacity: int, choices: tuple | None = None):
        self.target = target
        self.prepared = head if isinstance(head, PreparedMedusa) else PreparedMedusa(target, head)
        heads = self.prepared.config.medusa_heads
        self.static = None
        if choices is not None:
            if max(len(c) for c in choices) > heads:
                raise SpecdecError(f"--tree-choices go {max(len(c) for c in choices)} deep; this head has {heads} heads")
            self.static = tuple(t.tolist() for t in choices_to_parents([list(c) for c in choices]))  # parents, ranks
        self.caps = Capabilities(features=True, tree_nodes=len(self.static[0]) if self.static else 0)
        self.features = torch.zeros(capacity, self.prepared.config.hidden_size, device=target.device)

    def start(self, prompt: list[int]) -> None:
        pass

    def entry(self, context: int = 256):
        """One head's logits (a chain drafts one head per token), as a callable."""
        feature = torch.zeros(self.prepared.config.hidden_size, device=self.features.device)
        return lambda: self.prepared.logits(feature, 1)

    def feed(self, position: int, features: torch.Tensor) -> None:
        self.features[position:position + features.shape[0]] = features.float()

    def propose(self, state: DraftState) -> DraftTree:
        n, p = len(state.tokens), self.prepared
        k = min(state.k, p.config.medusa_heads)
        if k < 1 or n < 2:
            return DraftTree.empty()
        logits = p.logits(self.features[n - 2], k)  # [k, draft_vocab]
        if self.static is not None and state.tree:
            return self._static_tree(logits, state)
        if state.sampling.greedy:
            return DraftTree.chain(p.ids[logits.argmax(-1)])
        full = torch.full((k, self.target.config.vocab_size), float("-inf"), device=logits.device)
        full[:, p.ids] = logits
        q = probs_from_logits(full, state.sampling)  # [k, vocab]
        tokens = torch.stack([sample(q[i], state.generator) for i in range(k)]).view(-1)
        return DraftTree.chain(tokens, q)

    def _static_tree(self, logits: torch.Tensor, state: DraftState) -> DraftTree:
        parents, ranks = self.static
        depths = node_depths(parents)
        cap = state.max_nodes if state.max_nodes is not None else len(parents)
        keep = [i for i in range(len(parents)) if depths[i] <= logits.shape[0]][:cap]
        top = logits.topk(max(ranks) + 1, dim=-1).indices  # [k, ranks]
        index = {old: new for new, old in enumerate(keep)}
        tokens = [int(self.prepared.ids[top[depths[i] - 1, ranks[i]]]) for i in keep]
        return DraftTree(torch.tensor(tokens, dtype=torch.long, device=logits.device),
                         torch.tensor([index[parents[i]] if parents[i] >= 0 else -1 for i in keep], dtype=torch.long))


def build_head(parts, options, note):
    head = parts.heads.get(options.head_kind)
    if head is None:
        raise SpecdecError("this drafting method needs a head (--head NAME, or 'auto')")
    if isinstance(head, PreparedMedusa):
        if options.tree is not None and options.tree.choices is None:
            raise SpecdecError("a Medusa head drafts a static tree (--tree-choices), not --tree-budget")
        return MedusaDrafter(parts.target.module, head, parts.capacity, None if options.tree is None else options.tree.choices)
    return EagleDrafter(parts.target.module, head, parts.capacity, options.tree)


def head_label(parts, options, drafter):
    return f"{parts.heads[options.head_kind].config.kind} head {options.head}"


DRAFTERS = [(Entry("head", build_head, head_label, head=True, trees=True, chosen_by=("--head",)),
             {"eagle": {}, "eagle-tree": {"tree_sizes": True}, "medusa": {"head_kind": "medusa"}})]
