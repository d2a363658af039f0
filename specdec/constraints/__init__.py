"""Structured output: JSON Schema, any JSON object, regex, grammar (Lark or GBNF) and choice
constraints through llguidance. `Grammars.for_tokenizer(tokenizer, vocab_size, stop_ids)` once per
tokenizer; `grammars.constraint(ConstraintSpec(kind, value))` per sequence, whose `allowed()`,
`masks_along(tokens)`, `mask_after(drafted)`, `tree_masks(tokens, parents)`, `advance(tokens)`,
`forced(limit)` and `finished` the engine drives (base.py: that protocol, and the walks any
implementation of it gets from its masks_along)."""

from specdec.constraints.base import ConstraintProtocol, tree_masks, walk_masks
from specdec.constraints.grammar import Constraint, Grammars
from specdec.constraints.spec import JSON_LAYOUT, KINDS, ConstraintSpec

__all__ = ["JSON_LAYOUT", "KINDS", "Constraint", "ConstraintProtocol", "ConstraintSpec", "Grammars", "tree_masks", "walk_masks"]
