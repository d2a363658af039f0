"""OpenAI tools through the model's own chat template: the tool syntax a template speaks, the grammar
that forces a call (tool_choice "required" or a named function), and the calls read back out of the
answer, whole or as a stream.

Two syntaxes, as the templates write them:
- "hermes" (Qwen2.5, Qwen3, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks,
  one per call;
- "llama3" (Llama 3.1+): the answer is the call's JSON, `{"name": ..., "parameters": {...}}`.
A template that renders no tools has no syntax: a request with tools gets a 400 that says so.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Callable

from specdec.constraints import JSON_LAYOUT, ConstraintSpec
from specdec.server.protocol import collected


NL = "\n"  # a call's JSON sits on its own line between the markers, as the templates write it


@dataclass(frozen=True)
class ToolSyntax:
    name: str
    args_key: str  # the key of the call's arguments in its JSON
    open: str  # what starts a call ("" where the answer is the call)
    close: str

    def call_grammar(self, tools: list[dict], parallel: bool, term: Callable[[str], str] = json.dumps) -> ConstraintSpec:
        """A Lark grammar (llguidance) whose answers are calls of these tools (one, or several where
        parallel), their arguments under each tool's JSON Schema; `term` writes a marker as a grammar
        term (constraints.Vocabulary.term: by its token where the tokenizer has one for it)."""
        schema = {"anyOf": [self.call_schema(t) for t in tools], "x-guidance": JSON_LAYOUT}
        nl = json.dumps(NL)
        call = f"{term(self.open)} {nl} call_json {nl} {term(self.close)}" if self.open else "call_json"
        calls = f'call ("\\n" call)*' if parallel and self.open else "call"
        return ConstraintSpec("grammar", f"start: {calls}\ncall: {call}\ncall_json: %json {json.dumps(schema)}\n")

    def call_schema(self, tool: dict) -> dict:
        fn = tool["function"]
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        return {"type": "object", "properties": {"name": {"const": fn["name"]}, self.args_key: params},
                "required": ["name", self.args_key], "additionalProperties": False}

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(the answer's text outside its calls, or None where nothing is left; the calls, in OpenAI's
        shape). A block that is not a call's JSON stays text."""
        calls, rest = [], text
        if self.open:
            pattern = re.compile(re.escape(self.open) + r"\s*(.*?)\s*" + re.escape(self.close), re.S)
            for m in pattern.finditer(text):
                call = self.call_of(m.group(1))
                if call is not None:
                    calls.append(call)
                    rest = rest.replace(m.group(0), "", 1)
        else:
            call = self.call_of(text.strip().removeprefix("<|python_tag|>"))
            if call is not None:
                calls, rest = [call], ""
        rest = rest.strip()
        return (rest or None) if calls else text, calls

    def call_of(self, blob: str) -> dict | None:
        try:
            obj = json.loads(blob)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        given = obj.get(self.args_key, obj.get("arguments", obj.get("parameters", {})))
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": obj["name"], "arguments": given if isinstance(given, str) else json.dumps(given)}}

    def may_start(self, text: str) -> int:
        """Where in `text` a call may start (its held-back tail, while streaming): len(text) if nowhere."""
        if not self.open:
            return 0 if text.lstrip()[:1] in ("", "{", "<") else len(text)
        at = text.find(self.open)
        if at >= 0:
            return at
        for n in range(min(len(self.open) - 1, len(text)), 0, -1):  # a tail that may grow into the marker
            if self.open.startswith(text[-n:]):
                return len(text) - n
        return len(text)


HERMES = ToolSyntax("hermes", "arguments", "<tool_call>", "</tool_call>")
LLAMA3 = ToolSyntax("llama3", "parameters", "", "")


def syntax_of(template: str | None) -> ToolSyntax | None:
    """The tool syntax a chat template speaks, or None where it renders no tools."""
    if not template or "tools" not in template:
        return None
    if "<tool_call>" in template:
        return HERMES
    if "<|python_tag|>" in template or '"parameters"' in template:
        return LLAMA3
    return None


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as templates read them: an assistant's tool_calls with their arguments as objects
    (OpenAI sends JSON text; templates write `arguments | tojson`)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": _as_object(c["function"].get("arguments"))}}
                                     for c in calls]}
        out.append(m)
    return out


def _as_object(arguments):
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


class ToolStream:
    """A streamed answer with tools: text goes out as content until a call may start; from there it is
    held, and at the end the calls (or the held text, where it was none) go out."""

    def __init__(self, syntax: ToolSyntax):
        self.syntax, self.text, self.sent, self.holding = syntax, "", 0, False

    def feed(self, delta: str) -> str:
        """The content to send now."""
        self.text += delta
        if self.holding:
            return ""
        cut = max(self.sent, self.syntax.may_start(self.text))
        if cut < len(self.text):  # a call may start at cut: held from there once it surely does
            self.holding = (self.text.startswith(self.syntax.open, cut) if self.syntax.open
                            else bool(self.text.strip()))
        out, self.sent = self.text[self.sent:cut], cut
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """(the rest of the content, the calls)."""
        content, calls = self.syntax.parse(self.text[self.sent:])
        return (content or "", calls) if calls else (self.text[self.sent:], [])


def delivered(stream: ToolStream | None, text: str, last: bool) -> tuple[list[str], list[dict]]:
    """One delivery of an answer's text, read for calls where `stream` is given: (the text to send now,
    in pieces; the calls made, at the last delivery)."""
    if stream is None:
        return [text], []
    pieces = [stream.feed(text)]
    if not last:
        return pieces, []
    rest, made = stream.finish()
    return pieces + [rest], made


async def whole_answer(next_event, handle, syntax: ToolSyntax | None):
    """An answer gathered whole (protocol.collected) and read for calls where `syntax` is given: (its
    last event, its text outside the calls, the calls), or None where the client went away."""
    events = await collected(next_event, handle)
    if events is None:
        return None
    text = "".join(e.text for e in events)
    content, calls = syntax.parse(text) if syntax else (text, [])
    return events[-1], content, calls
