"""Layer-skip self-speculation: the target drafts with some of its own layers, then verifies with all.

The draft is the target's embedding, a chosen subset of its decoder layers (by default the first L)
and its own final norm and LM head: no second model and no copied weights. Tokens are proposed as a
chain, greedily or sampled from q (the same processed distribution the target's p gets), so the
engine's rejection sampling keeps the output exactly the target's.

Keys/values. For layers 0..L-1 (a prefix) the draft computes, at every slot, exactly what the full
target computes there: same token, same position, same weights, same earlier slots. So such a
drafter can write its keys/values straight into the target's KVCache (`share_target_cache`): the
target's prefill and verify passes have already filled layers 0..L-1 for every committed token, so
the drafter keeps no cache of its own and never feeds the prompt or an accepted token through its
layers; each proposal feeds only the last committed token and the drafts. A subset that is not a
prefix (say layers 0, 1, 5) sees different inputs at layer 5 than the full model does, so it keeps
its own small cache (len(layers) layers), kept in step with the committed tokens.

Verify. With a shared cache the drafter also holds the layer-L inputs (hidden states) of [last
committed token] + drafts, so the verify pass can start at layer L (`forward_from_layer`) instead
of recomputing layers 0..L-1 for those k + 1 positions: `LayerSkipDrafter.verify`, which the
engine calls in place of `specdec.sampling.verify.verify` (the drafter's caps say own_verify). Numerically the
reused values come from one-token passes while a plain verify computes them in one (k + 1)-token
pass; both are the exact target computation, and may differ only in float rounding by GEMM shape,
as plain and speculative decoding already do.

What that saves. The last draft token was proposed, never fed, so starting verify at layer L costs
one extra one-token pass through layers 0..L-1 for it. Arithmetic: verify drops (k + 1) x L layer-
token rows and the extra pass adds 1 x L, so k x L layer-token FLOPs are saved per step (compute-
bound hardware, or large k). Memory traffic: layers 0..L-1 are still read once per step (by that
extra pass instead of by verify), so batch-1 decoding that is bound by weight reads gains about
nothing from it. The shared cache itself saves the drafter's whole KV memory and its prefill of the
prompt through layers 0..L-1.

The partial forwards (embed, forward_layers, forward_from_layer, head) are the model's
(specdec.model.partial); choosing L by measurement is `specdec tune-layer-skip` (specdec.tune_layer_skip),
which keeps its choice per model with `save_choice`; `load_choice` reads it for `--layer-skip auto`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Union

import torch

from specdec.config import SamplingParams
from specdec.drafters.base import BaseDrafter, Capabilities, DraftState
from specdec.drafters.registry import Entry
from specdec.sampling.verify import Verified, accept_chain
from specdec.sampling.verify import verify as full_verify
from specdec.errors import SpecdecError
from specdec.model.kv_cache import KVCache
from specdec.model.partial import embed, forward_from_layer, forward_layers, head
from specdec.model.transformer import Transformer
from specdec.sampling.logits import probs_from_logits, sample
from specdec.tokens import common_prefix
from specdec.tree import DraftTree

LayerSpec = Union[int, list[int]]  # L (layers 0..L-1) or an ascending subset of layer indices
DEFAULT_CHOICE_PATH = "runs/layer_skip.json"


# ---- the layer spec ----

def resolve_layers(n_layers: int, layers: LayerSpec) -> list[int]:
    """L -> [0..L-1]; an explicit subset is checked. A clear SpecdecError for anything else."""
    if n_layers < 2:
        raise SpecdecError(f"layer skip needs a model with at least 2 layers; this one has {n_layers}")
    if isinstance(layers, bool):
        raise SpecdecError(f"layer skip takes L (an integer) or a list of layer indices, got {layers!r}")
    if isinstance(layers, int):
        if not 1 <= layers <= n_layers - 1:
            raise SpecdecError(f"layer-skip L must be in 1..{n_layers - 1} (the model has {n_layers} layers: "
                               f"the draft uses layers 0..L-1), got {layers}")
        return list(range(layers))
    try:
        chosen = list(layers)
    except TypeError:
        raise SpecdecError(f"layer skip takes L (an integer) or a list of layer indices, got {layers!r}") from None
    if not chosen:
        raise SpecdecError("the layer-skip subset is empty; give at least one layer index")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in chosen):
        raise SpecdecError(f"layer indices must be integers, got {chosen}")
    bad = [i for i in chosen if not 0 <= i < n_layers]
    if bad:
        raise SpecdecError(f"layer indices must be in 0..{n_layers - 1} (the model has {n_layers} layers), got {bad}")
    if any(b <= a for a, b in zip(chosen, chosen[1:])):
        raise SpecdecError(f"layer indices must be strictly ascending (each layer once, in model order), got {chosen}")
    if len(chosen) == n_layers:
        raise SpecdecError(f"the layer-skip subset {chosen} is every layer; leave at least one out")
    return chosen


def parse_layer_spec(text: str) -> LayerSpec | str:
    """CLI text -> L, a subset or 'auto': '8' -> 8; '0-5,8,10' -> [0, 1, 2, 3, 4, 5, 8, 10]; 'auto'."""
    text = text.strip()
    if text == "auto":
        return "auto"
    try:
        if "," not in text and "-" not in text:
            return int(text)
        out: list[int] = []
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            out += [int(lo)] if not hi else list(range(int(lo), int(hi) + 1))
        return out
    except ValueError:
        raise SpecdecError(f"--layer-skip takes L (e.g. 8), a layer list (e.g. 0-5,8,10) or 'auto'; "
                           f"got {text!r}") from None


# ---- the drafter ----

class LayerSkipDrafter(BaseDrafter):
    """Drafts a chain with `layers` of the target (L or a subset) + its final norm and LM head.

    Own-cache mode (default): a KVCache with len(layers) layers, rolled back to the prefix it shares
    with the committed tokens and fed the rest, like DraftModelDrafter.
    Shared mode (`share_target_cache`, prefixes 0..L-1 only): writes into the target's cache at the
    slots the verify pass will use; holds no cache and feeds only [last committed token] + drafts.
    """

    def __init__(self, target: Transformer, layers: LayerSpec, capacity: int, cache: KVCache | None = None,
                 pooled: bool = False):
        """cache: the target's (engine's) KV cache to share, as share_target_cache(cache) does; pooled
        (layers 0..L-1 only): a slot pool hands it its row of the target's cache before its first
        sequence (caps.target_cache), so it allocates no cache of its own unless started without one."""
        cfg = target.config
        self.target = target
        self.layers = resolve_layers(cfg.num_layers, layers)
        self.is_prefix = self.layers == list(range(len(self.layers)))
        pooled = pooled and self.is_prefix and cache is None
        self.caps = Capabilities(own_verify=True, target_cache=pooled)  # shared mode: verify starts at layer L
        self.capacity = min(capacity, cfg.max_position_embeddings)
        self.cache: KVCache | None = None  # own-cache mode: keys/values of the draft layers only
        self.shared: KVCache | None = None  # shared mode: the target's cache
        self.cached: list[int] = []  # own-cache mode: tokens whose keys/values self.cache holds
        self.committed = 0  # committed tokens at the last proposal (append-only, so still shared)
        self.tokens_fed = 0  # tokens run through the draft layers (a cost counter)
        self._last: dict | None = None  # shared mode: the last proposal, for verify
        if cache is not None:
            self.share_target_cache(cache)
        elif not pooled:
            self.cache = self._own_cache()

    def _own_cache(self) -> KVCache:
        cfg = self.target.config
        return KVCache(len(self.layers), cfg.num_kv_heads, cfg.head_dim, self.capacity, 1, self.target.dtype,
                       self.target.device)

    @property
    def spec(self) -> LayerSpec:
        """L for a prefix, else the subset (what save_choice stores)."""
        return len(self.layers) if self.is_prefix else list(self.layers)

    def share_target_cache(self, cache: KVCache) -> "LayerSkipDrafter":
        """Use the target's own cache for layers 0..L-1 (the engine's `cache`); drops the drafter's cache."""
        if not self.is_prefix:
            raise SpecdecError(f"only layers 0..L-1 can share the target's KV cache (their keys/values are the "
                               f"target's own); the subset {self.layers} keeps its own cache")
        cfg = self.target.config
        if cache.k.shape[0] != cfg.num_layers or cache.k.shape[2:] != (cfg.num_kv_heads, cache.capacity, cfg.head_dim):
            raise SpecdecError("share_target_cache needs the target's KV cache (one made by target.new_cache)")
        self.shared, self.cache = cache, None
        self.cached, self.committed, self._last = [], 0, None
        return self

    def adjust_costs(self, costs, target, measured: bool) -> None:
        costs.draft_cost = len(self.layers) / target.module.config.num_layers  # a pass through L of its layers

    def start(self, prompt: list[int]) -> None:
        self.cached, self.committed, self._last = [], 0, None
        if self.shared is None and self.cache is None:  # pooled, but started by an engine of its own
            self.cache = self._own_cache()
        if self.cache is not None:
            self.cache.reset()

    def propose(self, state: DraftState) -> DraftTree:
        self._last = None
        device = self.target.device
        if state.k < 1:
            return DraftTree.empty(device)
        if self.shared is not None:
            start = self.shared.length  # the target's verify pass writes [last token] + drafts from here
            feed = state.tokens[start:]
            if not feed:
                raise SpecdecError("the committed tokens are all in the target cache already; a shared "
                                   "layer-skip drafter expects the last committed token outside it")
        else:
            feed = self._sync(state.tokens)
            start = self.cache.length
        x = torch.tensor([feed], device=device)  # [1, T]
        pos = start
        drafted, qs, hiddens = [], [], []
        for _ in range(state.k):
            h = self._run(x, pos)  # [1, T, dim], layer-L inputs
            pos += x.shape[1]
            hiddens.append(h[:, -1:])
            logits = head(self.target, h[:, -1:])[0, -1]  # [vocab]
            q = None if state.sampling.greedy else probs_from_logits(logits, state.sampling)
            token = logits.argmax() if q is None else sample(q, state.generator)
            drafted.append(token.view(1))
            qs.append(q)
            x = token.view(1, 1)
        tokens = torch.cat(drafted)  # [k]
        if self.shared is not None:
            # hiddens[0] is the last committed token's, at slot start + len(feed) - 1
            self._last = {"slot": start + len(feed) - 1, "last": feed[-1], "tokens": tokens, "hidden": hiddens}
        else:
            self.cache.advance(pos - start)
            self.cached += tokens.tolist()[:-1]  # the last draft was never fed
        return DraftTree.chain(tokens, None if state.sampling.greedy else torch.stack(qs))

    def _run(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """tokens x # [1, T] at slots [start, start + T) through the draft layers -> hidden # [1, T, dim]."""
        self.tokens_fed += x.shape[1]
        if self.shared is not None:
            return forward_layers(self.target, embed(self.target, x), self.shared, start, self.layers)
        return forward_layers(self.target, embed(self.target, x), self.cache, start, self.layers,
                              cache_layers=list(range(len(self.layers))))

    def _sync(self, tokens: list[int]) -> list[int]:
        """Own-cache mode: roll back to the prefix shared with tokens; return the tokens to feed.

        Committed tokens only grow, so the comparison starts where the last proposal's ended; the last
        token is always fed again (its logits propose the first draft)."""
        keep = common_prefix(self.cached, tokens, min(self.committed, len(self.cached)))
        keep = min(keep, len(tokens) - 1)
        self.committed = len(tokens)
        self.cache.truncate(keep)
        self.cached = tokens[:]
        return tokens[keep:]

    # ---- verify from layer L (shared mode) ----

    def verify_hidden(self, cache: KVCache, last_token: int, tree: DraftTree) -> torch.Tensor | None:
        """Layer-L inputs # [1, k + 1, dim] of [last committed token] + the chain just proposed, with
        layers 0..L-1 of `cache` filled at those slots; None if this verify is not of that proposal.

        Feeds the last draft token through layers 0..L-1 (it was proposed, never fed)."""
        last, self._last = self._last, None
        if (last is None or self.shared is not cache or last["slot"] != cache.length or last["last"] != last_token
                or not tree.is_chain or len(tree) < 1 or len(tree) > len(last["tokens"])
                or not torch.equal(tree.tokens.to(last["tokens"].device), last["tokens"][:len(tree)])):
            return None
        k = len(tree)
        if k < len(last["hidden"]):  # a shortened chain: its last token was fed while drafting
            return torch.cat(last["hidden"][:k + 1], dim=1)
        final = self._run(last["tokens"][k - 1].view(1, 1).to(cache.k.device), cache.length + k)  # [1, 1, dim]
        return torch.cat(last["hidden"] + [final], dim=1)

    def verify(self, target: Transformer, cache: KVCache, last_token: int, tree: DraftTree,
               sampling: SamplingParams, generator: torch.Generator, masks: torch.Tensor | None = None) -> Verified:
        """The engine's verify of a drafting step (moves no cache): starts the verify pass at layer L when the drafter
        holds the shallow part of [last token] + draft, else runs the plain full verify."""
        return verify_from_draft(target, self, cache, last_token, tree, sampling, generator, masks)


def verify_from_draft(target: Transformer, drafter: LayerSkipDrafter, cache: KVCache, last_token: int,
                      tree: DraftTree, sampling: SamplingParams, generator: torch.Generator,
                      masks: torch.Tensor | None = None) -> Verified:
    """specdec.sampling.verify.verify, reusing the drafter's layers 0..L-1 for [last token] + draft."""
    hidden = drafter.verify_hidden(cache, last_token, tree) if target is drafter.target else None
    if hidden is None:
        return full_verify(target, cache, last_token, tree, sampling, generator, masks=masks)
    logits = forward_from_layer(target, hidden, cache, cache.length, len(drafter.layers))[0]  # [k + 1, vocab]
    return accept_chain(tree, logits, sampling, generator, masks=masks)


def make_layer_skip(target: Transformer, layers: LayerSpec, capacity: int, cache: KVCache | None = None,
                    pooled: bool = False) -> LayerSkipDrafter:
    """A LayerSkipDrafter sharing `cache` (the engine's) when its layers are a prefix, else with its own;
    pooled: without a cache, a prefix waits for its slot's row of the target's cache (serve)."""
    resolved = resolve_layers(target.config.num_layers, layers)
    prefix = resolved == list(range(len(resolved)))
    return LayerSkipDrafter(target, layers, capacity, cache if prefix else None, pooled)


# ---- the saved choice of L ----

def save_choice(path: str | os.PathLike, model_id: str, result: dict) -> None:
    """Store result["best"] (and the measurements) under model_id in a JSON file; other models' entries stay."""
    p = Path(path)
    data = _read_choices(p) if p.exists() else {}
    data[model_id] = {"layers": result["best"], "k": result.get("k"), "beats_plain": result.get("beats_plain"),
                      "results": result.get("results", []),
                      "plain_tokens_per_second": result.get("plain_tokens_per_second")}
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(p)


def load_choice(path: str | os.PathLike, model_id: str) -> LayerSpec:
    """The saved L (or subset) for model_id; a clear error when there is none."""
    p = Path(path)
    if not p.is_file():
        raise SpecdecError(f"no saved layer-skip choice at {p}; run `specdec tune-layer-skip --model {model_id}` first")
    entry = _read_choices(p).get(model_id)
    if not isinstance(entry, dict) or "layers" not in entry:
        raise SpecdecError(f"{p} has no layer-skip choice for {model_id!r}; "
                           f"run `specdec tune-layer-skip --model {model_id}` first")
    layers = entry["layers"]
    if isinstance(layers, bool) or not (isinstance(layers, int) or
                                        (isinstance(layers, list) and all(isinstance(i, int) for i in layers))):
        raise SpecdecError(f"{p}: the layer-skip choice for {model_id!r} is not an L or a layer list: {layers!r}")
    return layers


def _read_choices(p: Path) -> dict:
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise SpecdecError(f"cannot read layer-skip choices from {p}: {e}") from None
    if not isinstance(data, dict):
        raise SpecdecError(f"{p} is not a layer-skip choices file (expected a JSON object)")
    return data


def _build(parts, options, note):
    """Drafts into the target's cache: the engine's (Parts.cache), else its slot's row (serve's pool)."""
    return make_layer_skip(parts.target.module, parts.layers, parts.capacity, parts.cache, pooled=parts.cache is None)


DRAFTERS = [(Entry("layer-skip", _build, lambda p, o, d: f"layer-skip {d.spec}", layers=True, chosen_by=("--layer-skip",),
                   no_trees="--layer-skip drafts chains; it does not take --tree-budget / --tree-choices"), {})]
