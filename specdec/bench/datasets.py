"""Prompt sets: the shipped code prompts, Spec-Bench style JSONL (`turns`) or any JSONL with `prompt`
(and `suffix`: fill in the middle, the answer the text between the prompt and the suffix)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specdec.errors import SpecdecError


# Spec-Bench's question.jsonl labels its 80 MT-bench questions by MT-bench subcategory; Spec-Bench
# reports them together as its multi-turn category.
MT_BENCH_SUBCATEGORIES = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    turns: tuple[str, ...]  # one user message per turn
    suffix: str | None = None  # fill in the middle: the text after the gap (turns: the text before it, raw)


def parse_line(line: str, index: int) -> Prompt:
    row = json.loads(line)
    turns = row.get("turns") or ([row["prompt"]] if "prompt" in row else None)
    if not turns or not all(isinstance(t, str) and t for t in turns):
        raise ValueError("needs a non-empty 'prompt' string or 'turns' list")
    suffix = row.get("suffix")
    if suffix is not None and (not isinstance(suffix, str) or len(turns) != 1):
        raise ValueError("a 'suffix' is a string, beside one prompt")
    pid = str(row.get("id", row.get("question_id", index)))
    category = str(row.get("category", "default"))
    if category in MT_BENCH_SUBCATEGORIES and "question_id" in row:
        category = "multi_turn"
    return Prompt(pid, category, tuple(turns), suffix)


def read_jsonl(lines, source: str) -> list[Prompt]:
    prompts, skipped = [], 0
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            prompts.append(parse_line(line, i))
        except (ValueError, KeyError, TypeError):
            skipped += 1
    if skipped:
        print(f"warning: skipped {skipped} malformed line(s) in {source}", file=sys.stderr)
    if not prompts:
        raise SpecdecError(f"no usable prompts in {source}")
    return prompts


def load_prompts(path: str | None = None) -> list[Prompt]:
    """The shipped code prompts (path None) or a JSONL file."""
    if path is None:
        text = resources.files("specdec").joinpath("data/code_prompts.jsonl").read_text()
        return read_jsonl(text.splitlines(), "code_prompts.jsonl")
    p = Path(path)
    if not p.is_file():
        raise SpecdecError(f"dataset not found: {path}")
    with p.open() as f:
        return read_jsonl(f, path)
