"""OpenAI's Responses API, for the clients written against it (the openai SDKs' `responses`, the Agents
SDK, Codex): POST /v1/responses. Nothing is stored: each request carries its whole conversation.

A request is read into the OpenAI chat request the rest of the server runs (`ResponsesRequest.chat`):
- `instructions` is the first (system) message; `input` is text (one user message) or items: messages
  (roles user, assistant, system, developer; content text or input_text / output_text parts, joined as
  they come), `function_call` items (an assistant's calls; consecutive ones are one turn's calls) and
  `function_call_output` items (tool messages); reasoning items are dropped;
- `tools` are function tools (name, description, parameters), rendered by the model's chat template;
  `tool_choice` none, auto, required or {"type": "function", "name"}; `parallel_tool_calls`;
- `max_output_tokens` (unset: as many as the context leaves), `temperature`, `top_p`, and this server's
  other sampling fields (top_k, min_p, the penalties, seed, stop, speculative.n_max);
- `text.format` {"type": "json_schema", "schema"} or {"type": "json_object"} constrains the answer
  (structured output, speculatively and losslessly);
- `store`, `reasoning`, `include`, `metadata`, `truncation`, `user` and the prompt-cache fields are
  accepted and do nothing (nothing is stored; the prefix cache is always on).
Refused with a 400 naming the field: `previous_response_id` and `conversation` (nothing is stored: send
the conversation), image and file input, tools other than functions, `top_logprobs`, `background`.

The answer: {id "resp_...", object "response", status completed (or incomplete, incomplete_details
{reason: max_output_tokens} at the token limit; reason null where the server ended it early: its
request timeout, or a drain), output: [a message item with one output_text part, then a function_call
item per call], usage {input_tokens, input_tokens_details.cached_tokens, output_tokens, total_tokens,
speculative}, and the request's settings}. A stream is the API's events, each with its sequence_number:
response.created, response.in_progress, per item output_item.added, (a message's) content_part.added,
output_text.delta ..., output_text.done, content_part.done, (a call's) function_call_arguments.delta
and .done, output_item.done; then response.completed (or response.incomplete). An error after the
stream began is an `error` event.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specdec.server.protocol import APIError, ChatCompletionRequest, _Sampling, as_chat, each_valid
from specdec.server.tools import ToolStream, ToolSyntax, delivered, whole_answer

ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
PART_TYPES = ("input_text", "output_text", "text")


class Item(BaseModel):
    """One input item: a message, a function call, a call's output, or reasoning (dropped)."""

    model_config = ConfigDict(extra="ignore")
    type: str = "message"
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[dict] | None = None
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None
    arguments: str | None = None
    output: str | list[dict] | None = None

    @model_validator(mode="after")
    def _known(self):
        if self.type not in ITEM_TYPES:
            raise ValueError(f"input items of type {self.type!r} are not supported by this server (it reads "
                             "messages, function_call and function_call_output items, and drops reasoning)")
        needs = {"message": ("role", "content"), "function_call": ("call_id", "name", "arguments"),
                 "function_call_output": ("call_id", "output")}
        missing = [f for f in needs.get(self.type, ()) if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {self.type} item needs {', '.join(missing)}")
        for parts in (self.content, self.output):
            kinds = {p.get("type") for p in parts} - set(PART_TYPES) if isinstance(parts, list) else set()
            if kinds:
                raise ValueError(f"content parts of type {sorted(map(str, kinds))} are not supported by this "
                                 "server (it reads text)")
        return self

    @staticmethod
    def text_of(parts: str | list[dict] | None) -> str:
        return parts if isinstance(parts, str) else "".join(str(p.get("text", "")) for p in parts or [])


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    name: str | None = Field(None, min_length=1)
    description: str | None = None
    parameters: dict | None = None

    @model_validator(mode="after")
    def _function(self):
        if self.type != "function":
            raise ValueError(f"tools of type {self.type!r} are not supported by this server; give function tools")
        if self.name is None:
            raise ValueError("a function tool needs a name")
        return self

    def chat_tool(self) -> dict:
        fn = {"name": self.name} | {k: v for k, v in (("description", self.description),
                                                        ("parameters", self.parameters)) if v is not None}
        return {"type": "function", "function": fn}


class ResponsesRequest(_Sampling):
    """OpenAI's /v1/responses body (see the module's text)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    input: str | list[Item]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    tools: list[FunctionTool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    text: dict | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    top_logprobs: int | None = None
    background: bool | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _each_item(cls, v):
        return each_valid(Item, v, "item") if isinstance(v, list) else v

    @field_validator("input")
    @classmethod
    def _some_input(cls, v):
        if not v:
            raise ValueError("the input is empty; give text or items")
        return v

    @field_validator("previous_response_id", "conversation", "background")
    @classmethod
    def _stateless(cls, v, info):
        if v is not None and v is not False:
            raise ValueError(f"{info.field_name} is not supported: this server stores no responses; send the whole "
                             "conversation as input")
        return v

    @field_validator("top_logprobs")
    @classmethod
    def _no_logprobs(cls, v):
        if v:
            raise ValueError("top_logprobs is not supported on /v1/responses (use /v1/chat/completions)")
        return v

    def _structures(self):
        fmt = (self.text or {}).get("format") or {}
        kind = fmt.get("type", "text")
        if kind not in ("text", "json_object", "json_schema"):
            raise ValueError(f"text.format type {kind!r} is not one of text, json_object, json_schema")
        if kind == "json_schema" and not isinstance(fmt.get("schema"), dict):
            raise ValueError("text.format json_schema needs a schema")
        form = None if kind == "text" else {"type": kind} | (
            {"json_schema": {"name": fmt.get("name", "output"), "schema": fmt["schema"]}} if kind == "json_schema" else {})
        return super()._structures() + [("text.format", form)]

    def chat_messages(self) -> list[dict]:
        """The conversation as the OpenAI chat messages the server renders (see the module's text)."""
        out = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        items = [Item(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        names: dict[str, str] = {}  # a call's id -> its function's name
        for item in items:
            if item.type == "message":
                out.append({"role": item.role, "content": Item.text_of(item.content)})
            elif item.type == "function_call":
                names[item.call_id] = item.name
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}
                if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                    out[-1]["tool_calls"].append(call)  # one turn's calls
                elif out and out[-1]["role"] == "assistant" and not out[-1].get("tool_calls"):
                    out[-1]["tool_calls"] = [call]  # the text the calls came with
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif item.type == "function_call_output":
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": Item.text_of(item.output)}
                           | ({"name": names[item.call_id]} if item.call_id in names else {}))
        return out

    def chat(self) -> ChatCompletionRequest:
        """The OpenAI chat request this one is; an APIError (400) where it cannot be one."""
        body = {"messages": self.chat_messages(), "max_tokens": self.max_output_tokens, "stop": self.stop}
        form = dict(self._structures())["text.format"]
        if form is not None:
            body["response_format"] = form
        if self.tools:
            body["tools"] = [t.chat_tool() for t in self.tools]
            choice = self.tool_choice
            if isinstance(choice, dict):
                if choice.get("type") != "function":
                    raise APIError(400, f"tool_choice type {choice.get('type')!r} is not supported; give none, "
                                        "auto, required or {\"type\": \"function\", \"name\": ...}", param="tool_choice")
                choice = {"type": "function", "function": {"name": choice.get("name")}}
            body["tool_choice"] = choice
            body["parallel_tool_calls"] = self.parallel_tool_calls
        elif self.tool_choice not in (None, "none", "auto"):
            raise APIError(400, f"tool_choice {self.tool_choice!r} needs tools", param="tool_choice")
        return as_chat(self, "input", **body)

    def settings(self) -> dict:
        """The request's settings as a response echoes them."""
        return {"instructions": self.instructions, "max_output_tokens": self.max_output_tokens,
                "parallel_tool_calls": self.parallel_tool_calls, "temperature": self.temperature,
                "top_p": self.top_p, "tool_choice": self.tool_choice or "auto",
                "tools": [t.model_dump(exclude_none=True) for t in self.tools or []],
                "text": {"format": (self.text or {}).get("format") or {"type": "text"}}, "store": False,
                "metadata": {}, "truncation": "disabled", "previous_response_id": None, "reasoning": None,
                "error": None, "user": self.user}


def usage_of(usage: dict) -> dict:
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached,
                                                                            "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
            "speculative": usage.get("speculative", {})}


def status_of(ev) -> tuple[str, dict | None]:
    """(status, incomplete_details) of an answer that ended with `ev` (server/scheduler.py's 'done' Event)."""
    if ev.finish_reason == "stop":
        return "completed", None
    return "incomplete", {"reason": "max_output_tokens" if ev.finish_reason == "length" else None}


def call_item(call: dict, status: str = "completed") -> dict:
    """A call read from the answer (ToolSyntax's OpenAI shape) as a function_call item."""
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}", "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": status}


class ResponsesAnswer:
    """One request's answer in the Responses API's shapes: whole, or its stream of events (Answer's interface)."""

    def __init__(self, model_name: str, body: ResponsesRequest, tools: ToolSyntax | None):
        self.model_name, self.body, self.tools = model_name, body, tools
        self.id, self.created = f"resp_{uuid.uuid4().hex[:24]}", time.time()
        self.message_id = f"msg_{uuid.uuid4().hex[:24]}"
        self.sequence = 0

    def response(self, status: str, output: list[dict], usage: dict | None = None,
                 incomplete: dict | None = None) -> dict:
        return {"id": self.id, "object": "response", "created_at": self.created, "model": self.model_name,
                "status": status, "incomplete_details": incomplete, "output": output, "usage": usage,
                **self.body.settings()}

    def message(self, text: str, status: str = "completed") -> dict:
        return {"type": "message", "id": self.message_id, "role": "assistant", "status": status,
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}

    async def whole(self, next_event, handle):
        read = await whole_answer(next_event, handle, self.tools)
        if read is None:
            return Response(status_code=499)
        ev, content, calls = read
        status, incomplete = status_of(ev)
        output = ([self.message(content)] if content or not calls else []) + [call_item(c) for c in calls]
        return self.response(status, output, usage_of(ev.usage), incomplete)

    def event(self, kind: str, **data) -> str:
        self.sequence += 1
        body = {"type": kind, "sequence_number": self.sequence - 1, **data}
        return f"event: {kind}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n"

    async def stream(self, next_event, handle):
        finished, text, opened = False, "", False
        calls = ToolStream(self.tools) if self.tools else None
        try:
            yield self.event("response.created", response=self.response("in_progress", []))
            yield self.event("response.in_progress", response=self.response("in_progress", []))
            while True:
                ev = await next_event()
                if ev is None:
                    return
                if ev.error:
                    yield self.event("error", code="engine_error", message=ev.error, param=None)
                    break
                pieces, made = delivered(calls, ev.text, ev.kind == "done")
                for piece in filter(None, pieces):
                    if not opened:
                        for chunk in self.open_message():
                            yield chunk
                        opened = True
                    text += piece
                    yield self.event("response.output_text.delta", item_id=self.message_id, output_index=0,
                                     content_index=0, delta=piece, logprobs=[])
                if ev.kind != "done":
                    continue
                output = []
                if opened or not made:  # an answer of calls alone has no message item
                    for chunk in [*([] if opened else self.open_message()), *self.close_message(text)]:
                        yield chunk
                    output.append(self.message(text))
                for call in map(call_item, made):
                    for chunk in self.call_events(call, len(output)):
                        yield chunk
                    output.append(call)
                status, incomplete = status_of(ev)
                yield self.event(f"response.{status}", response=self.response(status, output, usage_of(ev.usage),
                                                                              incomplete))
                break
            finished = True
        finally:
            if not finished:
                handle.cancel()

    def open_message(self):
        yield self.event("response.output_item.added", output_index=0, item=self.message("", "in_progress") | {
            "content": []})
        yield self.event("response.content_part.added", item_id=self.message_id, output_index=0, content_index=0,
                         part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})

    def close_message(self, text: str):
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        yield self.event("response.output_text.done", item_id=self.message_id, output_index=0, content_index=0,
                         text=text, logprobs=[])
        yield self.event("response.content_part.done", item_id=self.message_id, output_index=0, content_index=0,
                         part=part)
        yield self.event("response.output_item.done", output_index=0, item=self.message(text))

    def call_events(self, call: dict, index: int):
        yield self.event("response.output_item.added", output_index=index,
                         item=call | {"arguments": "", "status": "in_progress"})
        yield self.event("response.function_call_arguments.delta", item_id=call["id"], output_index=index,
                         delta=call["arguments"])
        yield self.event("response.function_call_arguments.done", item_id=call["id"], output_index=index,
                         arguments=call["arguments"], name=call["name"])
        yield self.event("response.output_item.done", output_index=index, item=call)
