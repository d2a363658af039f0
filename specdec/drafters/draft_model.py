"""An independent small draft model with the target's tokenizer, drafting a chain autoregressively."""

from __future__ import annotations

import copy
import time

import torch
from torch import nn

from specdec.config import TreeConfig
from specdec.drafters.base import END, GO_ON, LAST, BaseDrafter, Capabilities, DraftState
from specdec.drafters.device_chain import chain_samplings, device_chains, draw_uniforms, pool_chains, stop_cut
from specdec.model import loaded_module
from specdec.model.cuda_graphs import enable_cuda_graphs
from specdec.model.quant import first_rows
from specdec.model.kv_cache import KVCache
from specdec.errors import SpecdecError
from specdec.model.transformer import Transformer
from specdec.sampling.logits import align_vocab, probs_from_logits, sample
from specdec.sampling.verify import ragged_inputs
from specdec.tokens import common_prefix
from specdec.tree import DraftTree, choices_to_parents


class DraftModelDrafter(BaseDrafter):
    """Keeps its own KV cache in step with the committed tokens; drafts k tokens per step.

    q is the draft's processed distribution (same temperature/top-k/top-p as the target's p),
    and draft tokens are sampled from that q, which rejection sampling needs to stay lossless.

    p_min > 0 stops a proposal early when the draft's top probability falls below it (llama.cpp's
    --draft-p-min, HF's assistant_confidence_threshold): a token it is unsure of is not drafted.
    A DraftState's `stop` rule (the adaptive policy's, tuned from measured costs and acceptance)
    ends it on the same top probability.
    """

    def __init__(self, model: Transformer, target_vocab: int, capacity: int, head_rows: int = 0,
                 p_min: float = 0.0, tree: TreeConfig | None = None, window: int = 0, on_device: bool | None = None):
        if not 0.0 <= p_min < 1.0:
            raise SpecdecError(f"draft p_min must be in [0, 1), got {p_min}")
        if window < 0:
            raise SpecdecError(f"the draft window must be >= 0 prompt tokens (0 = the whole prompt), got {window}")
        self.p_min = p_min
        self.window = window  # > 0: the draft sees only the prompt's last `window` tokens (a cheaper prefill)
        self.offset = 0  # leading tokens of this request the draft's cache leaves out
        self.tree = tree
        self.static = None if tree is None or tree.choices is None else tuple(
            t.tolist() for t in choices_to_parents([list(c) for c in tree.choices]))  # (parents, ranks) lists
        self.max_tree_nodes = 0 if tree is None else (len(self.static[0]) if self.static else tree.budget)
        # chains honour DraftState.stop (the policy's confidence rule); a pool drafts chains of many rows at once
        self.caps = Capabilities(tree_nodes=self.max_tree_nodes, pooled=tree is None, knows_confidence=True)
        self.pool_model = self if tree is None else None
        self.target_vocab = target_vocab
        self.cached: list[int] = []  # tokens whose keys/values the cache holds
        self.unread: torch.Tensor | None = None  # a device chain's fed tokens, read into `cached` next step
        self.committed = 0  # committed tokens at the last proposal (append-only, so still shared)
        # a model not loaded yet (model.DeferredModule) is loaded by load(), which the engine calls before the
        # drafter's first start; until then the drafter holds no weights and no cache
        self.source, self.model, self.cache, self.chains = model, None, None, None
        self._shape = (capacity, head_rows, on_device)
        if not getattr(model, "deferred", False):
            self.load()

    def load(self) -> float:
        """Loads a deferred draft model (its weights, its cache); the seconds it took (0.0 if loaded)."""
        if self.model is not None:
            return 0.0
        t0 = time.perf_counter()
        capacity, head_rows, on_device = self._shape
        model = loaded_module(self.source)
        self.model = truncated_head(model, head_rows) if 0 < head_rows < model.config.vocab_size else model
        # chains drafted on the device, one host sync a chain (device_chain.py): by default where the model
        # replays CUDA graphs
        self.chains = device_chains(self.model.graphs is not None, on_device)
        self.cache = model.new_cache(capacity)
        return time.perf_counter() - t0

    def new_pool_cache(self, batch: int) -> KVCache:
        """A draft cache of `batch` rows; a pool gives each of its drafters one row as `cache`."""
        self.load()
        return self.model.new_cache(self.cache.capacity, batch=batch)

    @staticmethod
    def propose_pooled(drafters: list["DraftModelDrafter"], states: list[DraftState], cache: KVCache,
                       rows: list[int]) -> list[DraftTree]:
        return propose_chains(drafters, states, cache, rows)

    def prefill_tokens(self, prompt_len: int) -> int:
        """Prompt tokens start() feeds the draft model for a prompt of this length."""
        return max(0, min(prompt_len - 1, self.window or prompt_len))

    def cost_model(self):
        return self.model if self.model is not None else self.source  # the deferred module: its fingerprint at once

    def tree_actions(self) -> dict:
        """Trees besides chains where configured for them: a static tree's own size, or powers of two
        below the node budget and the budget itself, at its depth cap."""
        budget = self.caps.tree_nodes
        if budget < 2:
            return {}
        if self.static is not None:
            return {"tree_sizes": (budget,), "tree_depth": max(node_depths(self.static[0]))}
        return {"tree_sizes": tree_sizes(budget), "tree_depth": self.tree.depth}

    def start(self, prompt: list[int]) -> None:
        """Prefill all but the prompt's last token now (part of the request's prefill), so the first
        proposal feeds two tokens like every other one and step times stay comparable. With a
        window, only the last `window` of those (positions from 0: the draft reads the text from
        there on, relative positions intact); drafts stay exact either way, only q changes."""
        self.load()
        keep = self.held(prompt)
        offset = self._offset(prompt)
        head = prompt[offset:-1]
        self.offset = offset
        self.cache.truncate(keep)
        self.cached, self.committed = list(head[:keep]), keep
        rest = head[keep:]
        if rest and len(head) < self.cache.capacity:
            self.model(torch.tensor([rest], device=self.cache.k.device), self.cache, keep, last_only=True)
            self.cache.advance(len(rest))
            self.cached, self.committed = list(head), len(head)

    def held(self, prompt: list[int]) -> int:
        """What the cache holds of the last request's text is kept where this prompt begins the same way
        (without a window: a windowed prefill starts elsewhere)."""
        if self.cache is None or not prompt:
            return 0
        self._read_back()
        if self._offset(prompt) != 0 or self.offset != 0:
            return 0
        return min(common_prefix(self.cached, prompt[:-1]), self.cache.length)

    def _offset(self, prompt: list[int]) -> int:
        """The prompt's leading tokens start() leaves out (the window's offset; 0 without one)."""
        return len(prompt) - 1 - self.prefill_tokens(len(prompt)) if prompt else 0

    def propose(self, state: DraftState) -> DraftTree:
        if state.k < 1:
            return DraftTree.empty(self.cache.k.device)
        if self.tree is not None and state.tree:
            return self._propose_tree(state)
        feed = self._sync(state.tokens)
        device = self.cache.k.device
        if self.drafts_on_device(state, feed):
            return self._propose_on_device(state, feed)
        chain = Chain(state, self.target_vocab, self._decide)
        x = feed + chain.unfed()
        while True:
            logits = self._logits(torch.tensor([x], device=device))  # [vocab]
            chain.consumed()
            if not chain.take(logits):
                break
            x = chain.unfed()
        self.cached += chain.tokens[:chain.fed]
        return chain.tree(device)

    def _propose_on_device(self, state: DraftState, feed: list[int]) -> DraftTree:
        """The chain drafted on the device to its limit, then cut by the stop rules (device_chain.py)."""
        rules = self.p_min > 0 or state.stop is not None
        chain = self.chains.draft(self.model, self.cache, feed, state.limit, state.sampling, state.generator,
                                  self.target_vocab, rules)
        if rules:  # the cut needs the chain on the host now
            self.cached += chain.tokens[0].tolist()[:-1]  # every token but the last was fed
            n = stop_cut(chain.top[0].tolist(), state.limit, lambda i, p: self._decision(p, state, i))
        else:  # read at the next step, when the device is idle: the verify follows the chain with no wait
            self.unread, n = chain.tokens[0, :-1], state.limit
        return DraftTree.chain(*chain.row(0, n, state.sampling.greedy))

    def _read_back(self) -> None:
        """`cached` completed with the last device chain's fed tokens (see _propose_on_device)."""
        if self.unread is not None:
            self.cached += self.unread.tolist()
            self.unread = None

    def drafts_on_device(self, state: DraftState, feed: list[int]) -> bool:
        """Whether this proposal's chain is drafted on the device: where the drafter does so, without a grammar
        (its masks need the host), with room for the feed and the chain."""
        return (self.chains is not None and state.forced is None and state.mask is None
                and self.cache.length + len(feed) + state.limit <= self.cache.capacity)

    def observe(self, num_accepted: int) -> None:
        pass

    def _decide(self, logits: torch.Tensor, q: torch.Tensor | None, state: DraftState, i: int) -> int:
        """Token i + 1: END (not drafted, the chain ends), LAST or GO_ON. The user's p_min ends the chain
        below it; then the state's confidence rule decides (both on the top probability of q, or of
        the raw softmax under greedy)."""
        if self.p_min <= 0 and state.stop is None:
            return GO_ON
        return self._decision(float((torch.softmax(logits, -1) if q is None else q).max()), state, i)

    def _decision(self, top: float, state: DraftState, i: int) -> int:
        """_decide on the top probability of token i + 1's distribution."""
        if top < self.p_min:
            return END
        return GO_ON if state.stop is None else state.stop(i, top)

    def _propose_tree(self, state: DraftState) -> DraftTree:
        """A tree of deterministic candidates (q = None): dynamic top-k expansion by cumulative draft
        log-probability (EAGLE-2 style), or the static rank paths of `choices`. One draft forward
        per depth; tree nodes are written past the committed prefix and dropped afterwards."""
        feed = self._sync(state.tokens)
        device = self.cache.k.device
        root = torch.log_softmax(self._logits(torch.tensor([feed], device=device)), -1)  # [vocab]
        prefix = self.cache.length  # committed tokens; the root (last one) sits at prefix - 1
        max_nodes = state.max_nodes if state.max_nodes is not None else self.max_tree_nodes
        if self.static is not None:
            tree = self._static_tree(root, prefix, state.k, max_nodes)
        else:
            tree = self._dynamic_tree(root, prefix, min(self.tree.depth, state.k), min(self.tree.budget, max_nodes))
        self.cache.truncate(prefix)
        return tree

    def _expand(self, nodes: list[int], tokens: list[int], parents: list[int], slots: dict[int, int],
                prefix: int) -> torch.Tensor:
        """Feed `nodes` (their ancestors are in the cache) in one forward; log-probs # [len(nodes), vocab]."""
        device = self.cache.k.device
        start = self.cache.length
        ancestors = []
        for node in nodes:
            chain, a = [], node
            while a >= 0:
                chain.append(a)
                a = parents[a]
            ancestors.append(chain)
        mask = torch.zeros(len(nodes), start + len(nodes), dtype=torch.bool, device=device)
        mask[:, :prefix] = True
        for row, chain in enumerate(ancestors):
            for a in chain[1:]:
                mask[row, slots[a]] = True
            mask[row, start + row] = True
            slots[nodes[row]] = start + row
        x = torch.tensor([[tokens[n] for n in nodes]], device=device)  # [1, R]
        positions = torch.tensor([[prefix - 1 + len(chain) for chain in ancestors]], device=device)  # [1, R]
        logits = self.model(x, self.cache, start, positions=positions, mask=mask)[0]  # [R, draft_vocab]
        self.cache.advance(len(nodes))
        return torch.log_softmax(align_vocab(logits, self.target_vocab), -1)

    def _dynamic_tree(self, root: torch.Tensor, prefix: int, depth: int, budget: int) -> DraftTree:
        topk = self.tree.topk
        tokens, parents, scores, depths, slots = [], [], [], [], {}
        values, ids = root.topk(topk)
        frontier = []
        for v, t in zip(values.tolist(), ids.tolist()):
            frontier.append(len(tokens))
            tokens.append(t), parents.append(-1), scores.append(v), depths.append(1)
        for d in range(2, depth + 1):
            frontier = sorted(frontier, key=lambda n: -scores[n])[:topk]
            logp = self._expand(frontier, tokens, parents, slots, prefix)  # [R, vocab]
            values, ids = logp.topk(topk, dim=-1)  # [R, topk]
            new = []
            for row, node in enumerate(frontier):
                for v, t in zip(values[row].tolist(), ids[row].tolist()):
                    new.append(len(tokens))
                    tokens.append(t), parents.append(node), scores.append(scores[node] + v), depths.append(d)
            frontier = new
        return select_tree(tokens, parents, scores, depths, budget, root.device)

    def _static_tree(self, root: torch.Tensor, prefix: int, max_depth: int, max_nodes: int) -> DraftTree:
        parents, ranks = self.static
        depths = node_depths(parents)
        keep = [i for i in range(len(parents)) if depths[i] <= max_depth][:max_nodes]
        tokens, slots = [0] * len(parents), {}
        need = max(ranks) + 1
        root_top = root.topk(need).indices.tolist()
        for i in keep:
            if parents[i] < 0:
                tokens[i] = root_top[ranks[i]]
        for d in range(2, max(depths[i] for i in keep) + 1 if keep else 1):
            level = [i for i in keep if depths[i] == d]
            par = sorted({parents[i] for i in level})
            top = self._expand(par, tokens, parents, slots, prefix).topk(need, dim=-1).indices.tolist()
            for i in level:
                tokens[i] = top[par.index(parents[i])][ranks[i]]
        index = {old: new for new, old in enumerate(keep)}
        return DraftTree(torch.tensor([tokens[i] for i in keep], dtype=torch.long, device=root.device),
                         torch.tensor([index[parents[i]] if parents[i] >= 0 else -1 for i in keep], dtype=torch.long))

    def _sync(self, tokens: list[int]) -> list[int]:
        """Roll the cache back to the prefix it shares with tokens (past the window's offset); return
        the tokens to feed."""
        self._read_back()
        tokens = tokens[self.offset:]
        n = min(common_prefix(self.cached, tokens, min(self.committed, len(self.cached))), len(tokens) - 1)
        self.committed = len(tokens)
        self.cache.truncate(n)
        self.cached = self.cached[:n]
        feed = tokens[n:]
        self.cached += feed
        return feed

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """Feed x # [1, T] at the cache end; return last-position logits # [target_vocab]."""
        start = self.cache.length
        logits = self.model(x, self.cache, start, last_only=True)[0, -1]  # [draft_vocab]
        self.cache.advance(x.shape[1])
        return align_vocab(logits, self.target_vocab)


@torch.inference_mode()
def propose_chains(drafters: list[DraftModelDrafter], states: list[DraftState], cache: KVCache,
                   rows: list[int]) -> list[DraftTree]:
    """Every drafter's chain of up to state.k tokens, drafted for all of them together: one draft
    forward per draft position over every row still drafting, instead of one per row. This is
    what lets a draft model pay in a batch: a forward of B rows reads the weights once, as one row.

    The drafters' caches must be rows `rows` of `cache` (KVCache.row) and share one model. Each row
    behaves as DraftModelDrafter.propose: it catches up on its committed tokens (a ragged first
    forward), drafts greedily or samples from its own q with its own generator (masked by its grammar
    where it has one), stops early under p_min, and leaves its cache holding exactly the tokens it fed."""
    if not drafters:
        return []
    model, device = drafters[0].model, cache.k.device
    if any(d.tree is not None for d in drafters) or any(d.model.model is not model.model for d in drafters):
        raise SpecdecError("batched drafting needs chain drafters sharing one draft model")
    live = [i for i, s in enumerate(states) if s.k >= 1]
    chains = [Chain(s, d.target_vocab, d._decide) for d, s in zip(drafters, states)]
    feeds = {i: drafters[i]._sync(states[i].tokens) + chains[i].unfed() for i in live}
    if live and all(drafters[i].drafts_on_device(states[i], feeds[i]) for i in live):
        return _rows_on_device(drafters, states, cache, rows, live, feeds)
    while live:
        lengths = [drafters[i].cache.length for i in live]
        tokens, slots, positions, mask = ragged_inputs(lengths, [feeds[i] for i in live], device)
        logits = model(tokens, cache, 0, positions=positions, mask=mask, slots=slots,
                       rows=torch.tensor([rows[i] for i in live], device=device))  # [B, T, draft_vocab]
        nxt = []
        for j, i in enumerate(live):
            drafters[i].cache.advance(len(feeds[i]))
            chains[i].consumed()
            if chains[i].take(align_vocab(logits[j, len(feeds[i]) - 1], drafters[i].target_vocab)):
                feeds[i] = chains[i].unfed()
                nxt.append(i)
        live = nxt
    for d, c in zip(drafters, chains):
        d.cached += c.tokens[:c.fed]
    return [c.tree(device) for c in chains]


def _rows_on_device(drafters: list[DraftModelDrafter], states: list[DraftState], cache: KVCache, rows: list[int],
                    live: list[int], feeds: dict[int, list[int]]) -> list[DraftTree]:
    """propose_chains on the device: every live row's chain to the longest limit among them (one graph under
    CUDA graphs, device_chain.py), one host read, then each row cut to its own limit and stop rules."""
    device, model = cache.k.device, drafters[live[0]].model
    limit = max(states[i].limit for i in live)
    samplings = chain_samplings(states[i].sampling for i in live)
    tops = any(drafters[i].p_min > 0 or states[i].stop is not None for i in live)
    uniforms = draw_uniforms([states[i].limit for i in live], samplings, [states[i].generator for i in live],
                             limit, device)
    chain = pool_chains(cache, drafters[live[0]].chains.graphed).draft_rows(
        model, cache, [rows[i] for i in live], [feeds[i] for i in live], [drafters[i].cache.length for i in live],
        limit, samplings, uniforms, drafters[live[0]].target_vocab, tops)
    tokens, top = chain.tokens.tolist(), chain.top.tolist() if tops else None
    out = [DraftTree.empty(device) for _ in drafters]
    for j, i in enumerate(live):
        d, state = drafters[i], states[i]
        d.cache.advance(len(feeds[i]) + limit - 1)  # the feed, and the chain but its last token
        d.cached += tokens[j][:limit - 1]
        n = state.limit if top is None else stop_cut(top[j], state.limit,
                                                     lambda k, p, d=d, state=state: d._decision(p, state, k))
        out[i] = DraftTree.chain(*chain.row(j, n, state.sampling.greedy))
    return out


class Chain:
    """One chain as it is drafted: the model's tokens, and under a grammar the tokens it forces after
    each of them (q one-hot; free: they count against the state's room, not its limit). The drafting
    loop feeds `unfed()` (with the committed tokens, first), calls `consumed()`, and hands the last
    position's logits to `take` until it says the chain is done; the draft cache then holds the first
    `fed` tokens."""

    def __init__(self, state: DraftState, vocab: int, decide):
        self.state, self.vocab, self.decide = state, vocab, decide
        self.tokens: list[int] = []
        self.qs: list[torch.Tensor | None] = []
        self.free: list[bool] = []
        self.drafted = 0  # the model's own tokens
        self.fed = 0  # the first `fed` tokens are in the draft cache
        self.sent = 0  # tokens handed out by unfed()
        self._force()

    def unfed(self) -> list[int]:
        """The tokens to feed next (a chain's last token is never fed: nothing drafts past it)."""
        self.sent = len(self.tokens)
        return self.tokens[self.fed:]

    def consumed(self) -> None:
        """The tokens unfed() gave are in the draft cache now."""
        self.fed = self.sent

    def take(self, logits: torch.Tensor) -> bool:
        """logits # [vocab]: the model's after every token so far. Draft the next token (masked by the
        grammar where there is one) and the forced ones after it; False: the chain is done."""
        state = self.state
        if len(self.tokens) >= state.most or self.drafted >= state.limit:
            return False  # the forced tokens filled it: they were fed with the committed ones
        if state.penalize is not None:  # the request's penalties, as the target's row after these tokens has them
            logits = state.penalize(logits, self.tokens)
        if state.mask is not None:  # under a grammar: draft from the masked distribution
            allowed = state.mask(self.tokens)  # [vocab]
            if allowed is None:  # the grammar is over
                return False
            logits = logits.masked_fill(~allowed.to(logits.device), float("-inf"))
        q = None if state.sampling.greedy else probs_from_logits(logits, state.sampling)
        decision = self.decide(logits, q, state, self.drafted)
        if decision == END:
            return False
        token = logits.argmax() if q is None else sample(q, state.generator)
        self._add(int(token), q, False)
        self.drafted += 1
        self._force()
        return decision == GO_ON and self.drafted < state.limit and len(self.tokens) < state.most

    def _force(self) -> None:
        state = self.state
        if state.forced is None or state.limit < 1:
            return
        for t in state.forced(state.most - len(self.tokens), self.tokens):
            q = None if state.sampling.greedy else torch.nn.functional.one_hot(torch.tensor(t), self.vocab).float()
            self._add(t, q, True)

    def _add(self, token: int, q: torch.Tensor | None, free: bool) -> None:
        self.tokens.append(token)
        self.qs.append(q)
        self.free.append(free)

    def tree(self, device) -> DraftTree:
        tokens = torch.tensor(self.tokens, dtype=torch.long, device=device)
        q = None if self.state.sampling.greedy or not self.qs else torch.stack([
            q.to(device) for q in self.qs])
        return DraftTree.chain(tokens, q, self.free)


def node_depths(parents: list[int]) -> list[int]:
    """Depth of every node (a root's child is 1) from topologically ordered parents (-1 = root)."""
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths


def select_tree(tokens: list[int], parents: list[int], scores: list[float], depths: list[int], budget: int,
                device) -> DraftTree:
    """The `budget` best nodes by score whose ancestors are all kept, in (depth, score) order."""
    kept: set[int] = set()
    for n in sorted(range(len(tokens)), key=lambda n: -scores[n]):
        if len(kept) == budget:
            break
        if parents[n] < 0 or parents[n] in kept:
            kept.add(n)
    order = sorted(kept, key=lambda n: (depths[n], -scores[n]))
    index = {old: new for new, old in enumerate(order)}
    return DraftTree(torch.tensor([tokens[n] for n in order], dtype=torch.long, device=device),
                     torch.tensor([index[parents[n]] if parents[n] >= 0 else -1 for n in order], dtype=torch.long))


def truncated_head(model: Transformer, rows: int) -> Transformer:
    """A view of the model whose LM head scores only token ids < rows (no weights copied).

    BPE ids are roughly ordered by merge frequency, so the first ids cover most drafted text
    (the idea of FR-Spec's frequency-ranked draft vocabulary). The head is a large part of a small
    draft model's bytes per step. q is 0 beyond `rows`; rejection sampling stays exact for any q,
    and the target recovers such tokens itself.
    """
    view = copy.copy(model)
    view._modules = dict(model._modules)
    if rows < model.lm_head.out_features and getattr(model, "fingerprint_key", None) is not None:
        view.fingerprint_key = f"{model.fingerprint_key}:head {rows}"  # a step of another cost
    view.lm_head = first_rows(model.lm_head, rows)  # [rows, hidden] of the weights, a view
    if getattr(model, "graphs", None) is not None:  # the view's graphs must replay the view's own head
        enable_cuda_graphs(view, model.graphs.max_tokens)
    return view


def tree_sizes(budget: int) -> tuple[int, ...]:
    """The dynamic tree sizes offered to the policy: powers of two below the node budget, and the budget."""
    return tuple(sorted({n for n in (4, 8, 16, 32, 64) if n < budget} | {budget}))

