"""Requests built here, prompts for --self-generate besides ShareGPT's first turns (mostly chat).

- Coding requests (`code`): each documented function of a source file gives one, phrased by one of a
  few templates (chosen by a hash of the function's id, so a run picks the same ones every time):
  write it from its signature and docstring, or add hints to it, explain, test or refactor its code.
- Text requests (`text`): each ShareGPT conversation with a prose answer gives one about that
  answer: summarize it, translate it, answer a question from it (the question that asked for it),
  or the conversation's own second turn after its first exchange. The target's answers to these
  teach a head the drafting of summaries, translations and answers that copy from a given text.
"""

from __future__ import annotations

import ast
import copy
import itertools
import textwrap
import zlib
from pathlib import Path
from typing import Iterator

from specdec.training.data import Document

FAMILIES = ("chat", "code", "text")  # --self-prompts: ShareGPT first turns, coding and text requests

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


PASSAGE_CHARS = (300, 900)  # a text request's passage: long enough to work on, short enough for its prompt
QUESTION_CHARS = 300
LANGUAGES = ("German", "French", "Spanish", "Italian", "Chinese")
TEXT_TEMPLATES = {
    "summary": "Summarize the following text in two or three sentences.\n\n{passage}",
    "translate": "Translate the following text into {language}.\n\n{passage}",
    "context": "Answer the question using the text below.\n\nText: {passage}\n\nQuestion: {question}",
}


def text_documents(conversations: Iterator[Document]) -> Iterator[Document]:
    """One text request per ShareGPT conversation that has a prose answer of PASSAGE_CHARS (code
    answers are the coding requests' part): its kind by a hash of the conversation's id, among the
    kinds it allows (`followup` and `context` need a short question before the answer, `followup` a
    second user turn after it)."""
    for doc in conversations:
        turns = doc.messages
        at = next((i for i, (role, text) in enumerate(turns) if role == "assistant" and is_prose(text)), None)
        if at is None:
            continue
        passage = cut(turns[at][1], PASSAGE_CHARS[1])
        if len(passage) < PASSAGE_CHARS[0]:
            continue
        question = turns[at - 1][1] if at > 0 and turns[at - 1][0] == "user" else ""
        short = question and len(question) <= QUESTION_CHARS
        kinds = ["summary", "translate"] + (["context"] if short else [])
        after = turns[at + 1] if at + 1 < len(turns) else None
        if short and after is not None and after[0] == "user" and len(after[1]) <= QUESTION_CHARS:
            kinds.append("followup")
        h = zlib.crc32(doc.id.encode())
        kind = kinds[h % len(kinds)]
        tid = f"text:{doc.id}:{kind}"
        if kind == "followup":
            messages = (("user", question), ("assistant", passage), after)
            yield Document(tid, "text", "\n\n".join(c for _, c in messages), messages)
            continue
        text = TEXT_TEMPLATES[kind].format(passage=passage, question=question,
                                           language=LANGUAGES[(h >> 8) % len(LANGUAGES)])
        yield Document(tid, "text", text, (("user", text),))


def is_prose(text: str) -> bool:
    """An answer of sentences, not code or a table: no code fence, few lines that look like code."""
    lines = [line for line in text.splitlines() if line.strip()]
    codeish = sum(line.startswith(("    ", "\t", "|")) or line.rstrip().endswith((";", "{", "}")) for line in lines)
    return "```" not in text and codeish <= len(lines) // 5


def cut(text: str, limit: int) -> str:
    """text up to `limit` characters, ending at the last paragraph or sentence end before it."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = text[:limit]
    end = max(head.rfind("\n\n"), head.rfind(". ") + 1, head.rfind(".\n") + 1)
    return head[:end].strip() if end > 0 else head.rsplit(" ", 1)[0]
