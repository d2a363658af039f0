"""A model drafter and prompt lookup together: copy when the text repeats, otherwise ask the model.

The model drafter is a draft model (DraftModelDrafter) or a head drafting from the target's
features (EagleDrafter, MedusaDrafter: `--head H --ngram`). Each step proposes one chain from one
source:
- prompt lookup (free) when the last `copy_n` tokens occurred earlier in the prompt or output;
  a match that long is a strong sign that the text copies (summaries, RAG answers, code edits),
  where lookup drafts are accepted as often as the model's and cost nothing;
- the model otherwise (or when lookup finds no match). A head keeps reading the target's features
  on every step, lookup steps included, and catches up on the committed tokens when it next drafts.

A request the policy does not admit for the draft model (its prefill of a long prompt would not pay
back, see specdec.policy) starts with `start_lookup_only`: the model does not see the request until
the policy starts it mid-answer, and until then every step drafts by lookup alone (n-gram sizes
max_n..min_n, as the plain n-gram drafter). Those steps are planned by the policy's waiting one
(AdaptivePolicy.lookup_while_waiting: lookup's own acceptance, free drafts), while the model's
policy reads the target's confidence at every token, as on plain steps, to decide when the model starts.

`--draft MODEL` alone is this drafter with copy_n None: a started model drafts every step (no lookup),
so where the draft model runs nothing changes; lookup drafts only the steps that would otherwise be
plain, while the model waits for its prefill to pay (summaries, RAG: long prompts whose answers copy
them).

Each proposal is verified by the same rules as any chain (its own q: None for lookup, the model's
for model drafts), so the output is exactly the target's.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from specdec.drafters.base import BaseDrafter, Capabilities, DraftState
from specdec.drafters.cross_tokenizer import build_draft
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.eagle import build_head, head_label
from specdec.drafters.ngram import ngram_continuation
from specdec.drafters.registry import Entry
from specdec.errors import SpecdecError
from specdec.tree import DraftTree


class HybridDrafter(BaseDrafter):

    def __init__(self, model: BaseDrafter, copy_n: int | None = 3, max_n: int = 3, min_n: int = 1):
        """copy_n: the match that makes a started model's step a lookup (None: never; lookup drafts only
        while the model waits to start)."""
        if not 1 <= min_n <= max_n or copy_n is not None and copy_n < 1:
            raise SpecdecError(f"hybrid drafter: need 1 <= min_n <= max_n and copy_n >= 1 (or None), "
                               f"got {min_n}, {max_n}, {copy_n}")
        self.model = model
        # its model's chains honour DraftState.stop; lookups draft their k as asked. Only a draft model
        # has a prefill to skip (lookup alone); a head reads the target's features
        self.caps = Capabilities(pooled=model.caps.pooled, lookup_only=isinstance(model, DraftModelDrafter),
                                 knows_confidence=True, features=model.caps.features)
        self.pool_model = model.pool_model
        self.copy_n, self.max_n, self.min_n = copy_n, max_n, min_n
        self.use_model = True
        self.lookup_steps = self.model_steps = 0  # proposals per source, over this drafter's life

    def start(self, prompt: list[int]) -> None:
        self.use_model = True
        self.model.start(prompt)

    def load(self) -> float:
        return self.model.load()

    def prefill_tokens(self, prompt_len: int) -> int:
        return self.model.prefill_tokens(prompt_len)

    def held(self, prompt: list[int]) -> int:
        return self.model.held(prompt)

    def start_lookup_only(self, prompt: list[int]) -> None:
        """This request drafts by lookup alone; the draft model is not started (no prefill)."""
        self.use_model = False

    def propose(self, state: DraftState) -> DraftTree:
        if state.k < 1:
            return DraftTree.empty()
        tree = self.lookup(state)
        return tree if tree is not None else self.model.propose(state)

    def lookup(self, state: DraftState) -> DraftTree | None:
        """This step's source: the lookup chain, or None when the draft model must propose (the
        batched server then drafts for many sequences in one draft forward)."""
        if self.use_model and self.copy_n is None:  # a started model drafts every step
            self.model_steps += 1
            return None
        tokens = np.asarray(state.tokens, dtype=np.int64)
        min_n = self.copy_n if self.use_model else self.min_n
        cont = ngram_continuation(tokens, state.k, max(self.max_n, min_n), min_n)
        if len(cont) or not self.use_model:
            self.lookup_steps += 1
            return DraftTree.chain(torch.from_numpy(cont.copy()))
        self.model_steps += 1
        return None

    def observe(self, num_accepted: int) -> None:
        self.model.observe(num_accepted)

    def feed(self, position: int, features: torch.Tensor) -> None:
        self.model.feed(position, features)

    def entry(self, context: int = 256):
        return self.model.entry(context)

    def step_seconds(self, context: int = 256, repeats: int = 5) -> float:
        return self.model.step_seconds(context, repeats)

    def cost_model(self):
        return self.model.cost_model()

    def adjust_costs(self, costs, target, measured: bool) -> None:
        self.model.adjust_costs(costs, target, measured)

    def row_costs(self, batches, context: int = 256, repeats: int = 5) -> dict[int, float] | None:
        return self.model.row_costs(batches, context, repeats)


def _hybrid_of(model_build):
    def build(parts, options, note):
        s = options.of("ngram")
        return HybridDrafter(model_build(parts, options, note), max_n=s.max_n, min_n=s.min_n)
    return build


def _draft(parts, options, note):
    return build_draft(parts, options, note)


def _draft_waiting_lookup(parts, options, note):
    """--draft MODEL: the draft model's drafter; a chain drafter of the target's tokenizer (one that can
    wait to start) drafts by prompt lookup until its model starts (copy_n None)."""
    model = build_draft(parts, options, note)
    if not isinstance(model, DraftModelDrafter) or model.tree is not None:
        return model
    s = options.of("ngram")
    return HybridDrafter(model, copy_n=None, max_n=s.max_n, min_n=s.min_n)


def _head(parts, options, note):
    return build_head(parts, replace(options, tree=None), note)


def _head_label(parts, options, drafter):
    return f"{head_label(parts, options, drafter)} + prompt lookup"


DRAFTERS = [(Entry("draft", _draft_waiting_lookup, lambda p, o, d: f"draft {o.draft}", draft_model=True, trees=True,
                   chain_theory=True, chosen_by=("--draft",)), {"tree": {"tree_sizes": True}}),
            (Entry("hybrid", _hybrid_of(_draft), lambda p, o, d: f"draft {o.draft} + prompt lookup", draft_model=True,
                   chosen_by=("--draft", "--ngram")), {}),
            (Entry("head-hybrid", _hybrid_of(_head), _head_label, head=True, chosen_by=("--head", "--ngram")),
             {"eagle-hybrid": {}})]
