"""OpenAI's Responses API behind the server (server/responses_api.py), with the openai SDK's `responses`
as the client, on the real SmolLM2-135M given the Hermes-style template of test_server_tools: a
response is the chat completion's answer to the same conversation, whole and streamed; function_call
and function_call_output items are the chat API's calls and results; text.format constrains the
answer; what this server does not do (stored responses, images, hosted tools) is a 400 naming it."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from specdec.server.responses_api import ResponsesRequest
from tests.test_server_tools import TIME, WEATHER, served  # noqa: F401 (served: the fixture)
from tests.test_server import client
from tests.test_server_anthropic import OPENAI_CONVERSATION

FUNCTIONS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
              "parameters": t["function"]["parameters"], "strict": True} for t in (WEATHER, TIME)]
ASK = "What is the weather in Paris?"


def events_of(base: str, body: dict) -> list[dict]:
    """A streamed response's events' data, as they came (each names its event's type)."""
    out, names = [], []
    with httpx.stream("POST", base + "/v1/responses", json=body | {"stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
            elif line.startswith("data: "):
                out.append(json.loads(line[6:]))
    assert names == [e["type"] for e in out]
    return out


@pytest.mark.real
def test_a_response_is_the_chat_completions_answer(served):
    """instructions + input parts through /v1/responses and the same conversation through chat
    completions: the same greedy text; completed at a stop, incomplete (max_output_tokens) at the limit."""
    c = client(served)
    for limit, stop in ((12, None), (40, ["."])):
        oa = c.chat.completions.create(model="smol", max_tokens=limit, temperature=0, stop=stop, messages=[
            {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}])
        r = c.responses.create(model="smol", instructions="You are terse.", max_output_tokens=limit, temperature=0,
                               input=[{"role": "user", "content": [{"type": "input_text", "text": "Name a "},
                                                                   {"type": "input_text", "text": "colour."}]}],
                               extra_body={"stop": stop} if stop else None)
        assert r.object == "response" and r.id.startswith("resp_") and r.output_text == oa.choices[0].message.content
        assert [o.type for o in r.output] == ["message"] and r.output[0].content[0].type == "output_text"
        finish = oa.choices[0].finish_reason
        assert (r.status, r.incomplete_details and r.incomplete_details.reason) == (
            ("completed", None) if finish == "stop" else ("incomplete", "max_output_tokens"))
        assert r.usage.input_tokens == oa.usage.prompt_tokens and r.usage.output_tokens == oa.usage.completion_tokens
        assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
        assert r.instructions == "You are terse." and r.max_output_tokens == limit
    assert r.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens - 1  # the same prompt again


@pytest.mark.real
def test_the_stream_is_the_apis_events_and_makes_the_whole_response(served):
    body = {"model": "smol", "input": "Tell me about cats.", "max_output_tokens": 40, "temperature": 0, "stop": ["."]}
    whole = httpx.post(served + "/v1/responses", json=body, timeout=60).json()
    events = events_of(served, body)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert text == whole["output"][0]["content"][0]["text"] == final["output"][0]["content"][0]["text"]
    assert final["status"] == whole["status"] == "completed" and final["usage"]["output_tokens"] == whole["usage"][
        "output_tokens"]
    with client(served).responses.stream(model="smol", input=body["input"], max_output_tokens=40, temperature=0,
                                         extra_body={"stop": ["."]}) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        assert "".join(deltas) == text and s.get_final_response().output_text == text
    cut = events_of(served, body | {"max_output_tokens": 3, "stop": None})
    assert cut[-1]["type"] == "response.incomplete" and cut[-1]["response"]["incomplete_details"] == {
        "reason": "max_output_tokens"}


@pytest.mark.real
def test_a_forced_function_call_whole_and_streamed_then_its_output(served):
    c = client(served)
    kw = dict(model="smol", input=ASK, tools=FUNCTIONS, tool_choice={"type": "function", "name": "get_time"},
              parallel_tool_calls=False, max_output_tokens=80, temperature=0)
    r = c.responses.create(**kw)
    assert r.status == "completed" and [o.type for o in r.output] == ["function_call"]
    call = r.output[0]
    assert call.name == "get_time" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), TIME["function"]["parameters"])
    with c.responses.stream(**kw) as s:
        streamed = s.get_final_response().output
    assert [(o.type, o.name, o.arguments) for o in streamed] == [("function_call", "get_time", call.arguments)]
    again = c.responses.create(model="smol", tools=FUNCTIONS, tool_choice="none", max_output_tokens=16, temperature=0,
                               input=[{"role": "user", "content": ASK}, call.model_dump(exclude_none=True),
                                      {"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}])
    assert [o.type for o in again.output] == ["message"] and again.output_text


ITEMS = [
    {"role": "user", "content": "Weather and time in Paris?"},
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
    {"type": "function_call", "call_id": "t1", "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
    {"type": "function_call", "call_id": "t2", "name": "get_time", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "t1", "output": "18 C"},
    {"type": "function_call_output", "call_id": "t2", "output": [{"type": "input_text", "text": "12:00"}]},
    {"role": "user", "content": "Thanks."}]
CHAT = [{"role": "system", "content": "Be kind."}, *OPENAI_CONVERSATION]  # the same conversation, in chat messages


def test_items_become_chat_messages_in_their_order():
    body = ResponsesRequest.model_validate({"model": "m", "input": ITEMS, "instructions": "Be kind."})
    assert body.chat_messages() == CHAT
    calls_alone = ResponsesRequest.model_validate({"model": "m", "input": [ITEMS[0], ITEMS[3], ITEMS[5]]})
    assert calls_alone.chat_messages()[1] == {"role": "assistant", "content": "", "tool_calls": CHAT[2]["tool_calls"][:1]}


@pytest.mark.real
def test_a_conversation_with_calls_renders_as_its_chat_twin(served):
    c = client(served)
    r = c.responses.create(model="smol", input=ITEMS, instructions="Be kind.", tools=FUNCTIONS, max_output_tokens=1,
                           temperature=0)
    oa = c.chat.completions.create(model="smol", messages=CHAT, tools=[WEATHER, TIME], max_tokens=1, temperature=0)
    assert r.usage.input_tokens == oa.usage.prompt_tokens and r.output_text == oa.choices[0].message.content


@pytest.mark.real
def test_text_format_constrains_the_answer(served):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"], "additionalProperties": False}
    r = client(served).responses.create(model="smol", input="Name a colour, as JSON.", max_output_tokens=60,
                                        temperature=0, text={"format": {"type": "json_schema", "name": "colour",
                                                                        "schema": schema, "strict": True}})
    assert r.status == "completed" and r.text.format.type == "json_schema"
    jsonschema.validate(json.loads(r.output_text), schema)
    r = client(served).responses.create(model="smol", input="Name a colour, as JSON.", max_output_tokens=60,
                                        temperature=0, text={"format": {"type": "json_object"}})
    assert r.output_text.startswith("{")  # an object under way (this model may run past the limit)
    assert r.status == "incomplete" or isinstance(json.loads(r.output_text), dict)


BAD = [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "stores no responses"),
    ({"input": "x", "conversation": "conv_1"}, "conversation", "stores no responses"),
    ({"input": "x", "background": True}, "background", "stores no responses"),
    ({"input": ""}, "input", "empty"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input",
     "input_image"),
    ({"input": [{"type": "web_search_call", "id": "w"}]}, "input", "web_search_call"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input", "call_id"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "web_search"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"input": "x", "tools": FUNCTIONS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "nope"),
    ({"input": "x", "tools": FUNCTIONS, "tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice",
     "allowed_tools"),
    ({"input": "x", "text": {"format": {"type": "grammar"}}}, None, "grammar"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}}, None, "schema"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs", "chat/completions"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "greater than or equal to 1"),
]


@pytest.mark.real
@pytest.mark.parametrize("body, param, part", BAD)
def test_bad_bodies_are_400s_naming_the_problem(served, body, param, part):
    r = httpx.post(served + "/v1/responses", json={"model": "smol"} | body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert part in err["message"], err
    if param is not None:
        assert (err["param"] or "").startswith(param), err


def answered(events: list, stream: bool):
    """ResponsesAnswer over scheduler events given by hand (the Hermes syntax): the whole response, or
    the streamed events' data."""
    from specdec.server.responses_api import ResponsesAnswer
    from specdec.server.tools import HERMES
    from tests.test_server_anthropic import drive
    answer = ResponsesAnswer("m", ResponsesRequest.model_validate({"model": "m", "input": "x"}), HERMES)
    out = drive(answer, events, stream)
    return [data for _, data in out] if stream else out


@pytest.mark.parametrize("pieces, text, calls", [
    (["Sure <tool_", "call>not json</tool_call>"], "Sure <tool_call>not json</tool_call>", []),
    (["Let me check.\n<tool_call>\n", '{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'],
     "Let me check.", [("get_time", {"city": "Oslo"})]),
    (["<tool_call>\n", '{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'], None,
     [("get_time", {"city": "Oslo"})]),
])
def test_held_text_and_calls_stream_as_they_stand_whole(pieces, text, calls):
    """Text that might begin a call is held while streaming: it goes out as text where it was none, and
    a call as a function_call item after the message (no message where the answer is calls alone)."""
    from specdec.server.scheduler import Event
    usage = {"prompt_tokens": 7, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 2}}
    events = [Event("delta", pieces[0]), Event("done", pieces[1], finish_reason="stop", usage=usage)]
    whole = answered(events, stream=False)
    messages = [o["content"][0]["text"] for o in whole["output"] if o["type"] == "message"]
    assert messages == ([] if text is None else [text])
    assert [(o["name"], json.loads(o["arguments"])) for o in whole["output"] if o["type"] == "function_call"] == calls
    assert whole["usage"]["input_tokens_details"]["cached_tokens"] == 2 and whole["status"] == "completed"
    streamed = answered(events, stream=True)
    sent = "".join(e["delta"] for e in streamed if e["type"] == "response.output_text.delta")
    assert sent.strip() == (text or "")  # (the text before a call may keep its line end when streamed)
    added = [e for e in streamed if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == list(range(len(added)))
    final = streamed[-1]["response"]
    assert [o["type"] for o in final["output"]] == [o["type"] for o in whole["output"]]
    assert [(o["name"], json.loads(o["arguments"])) for o in final["output"] if o["type"] == "function_call"] == calls


@pytest.mark.real
@pytest.mark.parametrize("limit", [None, 8])
def test_an_input_past_the_context_is_a_400(served, limit):
    body = {"model": "smol", "input": "word " * 2000} | ({"max_output_tokens": limit} if limit else {})
    r = httpx.post(served + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
