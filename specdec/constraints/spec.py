"""What a constrained output must match, and its grammar in llguidance's terms.

JSON comes out in one fixed layout, as `json.dumps` writes it: `{"a": 1, "b": [2, 3]}` (", " between
items, ": " after keys, no other whitespace), so that a model cannot wander off into whitespace and
more of the structure is forced (jump-forward). A schema's own "x-guidance" settings override this.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from llguidance import LLMatcher
from llguidance.gbnf_to_lark import any_to_lark

from specdec.errors import SpecdecError

KINDS = ("json_schema", "json_object", "regex", "grammar", "choice")
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class ConstraintSpec:
    """kind and its value:

    - "json_schema": a JSON Schema, as a dict or its JSON text (draft 2020-12 keywords llguidance
      implements; an unimplemented keyword is an error, never silently ignored)
    - "json_object": any JSON object (value None)
    - "regex": a regular expression (Rust `regex` syntax) the whole output matches
    - "grammar": a context-free grammar, in Lark syntax as llguidance reads it (`start: ...`) or in
      GBNF as llama.cpp writes it (`root ::= ...`)
    - "choice": a list of strings; the output is exactly one of them
    """

    kind: str
    value: object = None
    key: str = field(init=False, repr=False, compare=False)  # canonical text: the compile cache's key

    def __post_init__(self):
        if self.kind not in KINDS:
            raise SpecdecError(f"unknown constraint kind {self.kind!r}; use one of {', '.join(KINDS)}")
        object.__setattr__(self, "value", CHECKS[self.kind](self.value))
        object.__setattr__(self, "key", self.kind + ":" + json.dumps(self.value, sort_keys=True))

    def __hash__(self) -> int:
        return hash(self.key)

    def grammar(self) -> str:
        """llguidance's grammar for this spec (checked when a matcher is built from it)."""
        return GRAMMARS[self.kind](self.value)

    def validate(self) -> "ConstraintSpec":
        """The spec itself once its grammar checks out without a tokenizer (a malformed schema, regex or
        grammar found before a model loads); SpecdecError naming the problem if it does not."""
        try:
            problem = LLMatcher.validate_grammar(self.grammar())
        except ValueError as e:
            problem = str(e)
        if problem:
            raise SpecdecError(f"the {self.kind} constraint is not valid: {problem.strip().splitlines()[0]}")
        return self


def check_schema(value) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise SpecdecError(f"the JSON schema is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise SpecdecError(f"a JSON schema must be a JSON object, not {type(value).__name__}")
    return value


def check_none(value) -> None:
    if value is not None:
        raise SpecdecError("a json_object constraint takes no value (use json_schema for a schema)")


def check_text(value) -> str:
    if not isinstance(value, str) or not value:
        raise SpecdecError(f"a regex or grammar constraint needs non-empty text, not {value!r}")
    return value


def check_choice(value) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise SpecdecError("a choice constraint needs a non-empty list of strings")
    if not all(isinstance(v, str) for v in value):
        raise SpecdecError(f"every choice must be a string: {value!r}")
    return tuple(value)


def lark(text: str) -> str:
    """A Lark grammar's text, GBNF converted (llguidance's any_to_lark tells the two apart)."""
    try:
        return any_to_lark(text)
    except Exception as e:  # noqa: BLE001 - the converter raises bare Exceptions for bad GBNF
        raise SpecdecError(f"the grammar does not parse as Lark or GBNF: {e}") from None


def choice_grammar(options: tuple[str, ...]) -> str:
    return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options))


CHECKS = {"json_schema": check_schema, "json_object": check_none, "regex": check_text, "grammar": check_text,
          "choice": check_choice}
GRAMMARS = {"json_schema": lambda v: LLMatcher.grammar_from_json_schema(v, defaults=JSON_LAYOUT),
            "json_object": lambda v: LLMatcher.grammar_from_json_schema(ANY_OBJECT, defaults=JSON_LAYOUT),
            "regex": LLMatcher.grammar_from_regex,
            "grammar": lambda v: LLMatcher.grammar_from_lark(lark(v)),
            "choice": choice_grammar}
