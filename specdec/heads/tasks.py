"""Coding requests built from the functions of source files: prompts for --self-generate.

The target's own answers to coding requests teach a head the text it drafts on code; ShareGPT's first
turns are mostly chat. Each documented function of a file gives one request, phrased by one of a few
templates (chosen by a hash of the function's id, so a run picks the same ones every time): write it
from its signature and docstring, or add hints to it, explain, test or refactor its code.
"""

from __future__ import annotations

import ast
import copy
import itertools
import textwrap
import zlib
from pathlib import Path
from typing import Iterator

from specdec.heads.data import Document

MIN_LINES, MAX_LINES = 4, 40  # a function's source: long enough to ask about, short enough to answer
PER_FILE = 3

TEMPLATES = (
    "Write a Python function `{signature}`. Its docstring says: {summary}",
    "Add type hints and a docstring to this function and return the complete function:\n\n```python\n{bare}\n```",
    "Explain what this Python function does, step by step:\n\n```python\n{code}\n```",
    "Write pytest unit tests for this function:\n\n```python\n{code}\n```",
    "Refactor this function to be easier to read, keeping its behaviour, and return the full code:\n\n"
    "```python\n{bare}\n```",
)


def task_documents(files: list[Path]) -> Iterator[Document]:
    """Coding requests for up to PER_FILE documented functions of each file, the files in an order
    fixed by a hash of their paths (so that a few hundred requests spread over many modules, not the
    first few in alphabetical order); a file that does not parse is skipped."""
    for path in sorted(files, key=lambda p: zlib.crc32(str(p).encode())):
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = text.splitlines()
        nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        tasks = (function_task(path, n, lines) for n in nodes)
        yield from itertools.islice((t for t in tasks if t is not None), PER_FILE)


def function_task(path: Path, node, lines: list[str]) -> Document | None:
    docstring = ast.get_docstring(node)
    code = textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno]))
    if not docstring or node.name.startswith("_") or not MIN_LINES <= code.count("\n") + 1 <= MAX_LINES:
        return None
    tid = f"task:{path}:{node.lineno}:{node.name}"
    template = TEMPLATES[zlib.crc32(tid.encode()) % len(TEMPLATES)]
    fields = {"signature": lambda: f"{node.name}({ast.unparse(node.args)})", "code": lambda: code,
              "bare": lambda: bare_code(node), "summary": lambda: summary(docstring)}
    text = template.format(**{k: make() for k, make in fields.items() if "{" + k + "}" in template})
    return Document(tid, "task", text, (("user", text),))


def summary(docstring: str) -> str:
    """The docstring's first paragraph, on one line."""
    return " ".join(docstring.strip().split("\n\n")[0].split())


def bare_code(node) -> str:
    """The function's code without its docstring and annotations (comments are lost)."""
    node = copy.deepcopy(node)
    node.body = node.body[1:] or [ast.Pass()]
    node.returns = None
    params = node.args  # ast.arguments
    for a in params.posonlyargs + params.args + params.kwonlyargs:
        a.annotation = None
    return ast.unparse(node)
