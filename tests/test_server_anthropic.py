"""Anthropic's Messages API behind the server (server/anthropic_api.py), with the anthropic SDK as the
client, on the real SmolLM2-135M given the Hermes-style template of test_server_tools: a message is the
chat completion's answer to the same conversation, whole and streamed; tool_use and tool_result blocks
are the OpenAI calls and results; a last assistant message is a prefill; output_config constrains the
answer; bad bodies, a wrong key and a wrong model are errors in Anthropic's shape."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from specdec.errors import SpecdecError
from specdec.model.byte_bpe import up_to_final
from specdec.server.anthropic_api import MessagesRequest
from tests.test_server import chat_dir, client, guarded  # noqa: F401 (chat_dir, guarded: fixtures)
from tests.test_server_tools import TIME, WEATHER, served  # noqa: F401 (served: the fixture)

GREEDY = {"extra_body": {"temperature": 0}}  # the SDK no longer takes sampling fields; the server does
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
          "input_schema": t["function"]["parameters"]} for t in (WEATHER, TIME)]


def anth(base: str, key: str = "x") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=60)


def events_of(base: str, body: dict) -> list[tuple[str, dict]]:
    """A streamed answer's (event name, data) pairs, as they came."""
    out, name = [], None
    with httpx.stream("POST", base + "/v1/messages", json=body | {"stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
    return out


@pytest.mark.real
def test_a_message_is_the_chat_completions_answer(served):
    """One conversation (a system prompt, a user message of two text blocks) through both APIs: the same
    greedy text and stop; usage splits the prompt into cache reads and the rest; count_tokens agrees."""
    system, blocks = "You are terse.", [{"type": "text", "text": "Name a "}, {"type": "text", "text": "colour."}]
    oa = client(served).chat.completions.create(
        model="smol", messages=[{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}],
        max_tokens=12, temperature=0)
    for _ in range(2):  # the second finds its prompt in the prefix cache
        m = anth(served).messages.create(model="smol", system=system, max_tokens=12,
                                         messages=[{"role": "user", "content": blocks}], **GREEDY)
        assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
        assert [b.type for b in m.content] == ["text"] and m.content[0].text == oa.choices[0].message.content
        assert m.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[oa.choices[0].finish_reason]
        assert m.usage.input_tokens + m.usage.cache_read_input_tokens == oa.usage.prompt_tokens
        assert m.usage.output_tokens == oa.usage.completion_tokens
    assert m.usage.cache_read_input_tokens >= oa.usage.prompt_tokens - 1
    counted = anth(served).messages.count_tokens(model="smol", system=system,
                                                 messages=[{"role": "user", "content": blocks}])
    assert counted.input_tokens == oa.usage.prompt_tokens


@pytest.mark.real
def test_the_stream_is_anthropics_events_and_makes_the_whole_message(served):
    body = {"model": "smol", "max_tokens": 24, "messages": [{"role": "user", "content": "Tell me about cats."}],
            "temperature": 0}
    whole = httpx.post(served + "/v1/messages", json=body, timeout=60).json()
    events = events_of(served, body)
    names = [n for n, _ in events]
    assert all(data["type"] == name for name, data in events)
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert events[0][1]["message"]["content"] == [] and events[0][1]["message"]["stop_reason"] is None
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert [{"type": "text", "text": text}] == whole["content"]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    with anth(served).messages.stream(model="smol", max_tokens=24, messages=body["messages"], **GREEDY) as s:
        assert "".join(s.text_stream) == text
        final = s.get_final_message()
    assert final.content[0].text == text and final.stop_reason == whole["stop_reason"]


@pytest.mark.real
def test_a_stop_sequence_ends_the_answer_and_is_named(served):
    c = anth(served)
    kw = dict(model="smol", max_tokens=40, messages=[{"role": "user", "content": "Describe the sea."}], **GREEDY)
    text = c.messages.create(**kw).content[0].text
    at = next(i for i in range(len(text) // 2, len(text) - 4) if text.find(text[i:i + 4]) == i and text[i:i + 4].strip())
    word = text[at:at + 4]
    m = c.messages.create(stop_sequences=[word], **kw)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word and m.content[0].text == text[:at]
    events = events_of(served, {"model": "smol", "max_tokens": 40, "messages": kw["messages"], "temperature": 0,
                                "stop_sequences": [word]})
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": word}


@pytest.mark.real
def test_a_forced_tool_use_whole_and_streamed_then_its_result(served):
    """tool_choice tool: one tool_use of that tool, its input under the schema, stop_reason tool_use;
    streamed, the same input through one input_json_delta; its tool_result goes back and the model answers."""
    c = anth(served)
    kw = dict(model="smol", max_tokens=80, messages=ASK, tools=TOOLS, **GREEDY,
              tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True})
    m = c.messages.create(**kw)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and [u.name for u in uses] == ["get_time"]
    assert uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, TIME["function"]["parameters"])
    with c.messages.stream(**kw) as s:
        final = s.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert [(u.name, u.input) for u in streamed] == [("get_time", uses[0].input)] and final.stop_reason == "tool_use"
    follow = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                  "content": [{"type": "text", "text": "12:00"}]}]}]
    again = c.messages.create(model="smol", max_tokens=16, messages=follow, tools=TOOLS,
                              tool_choice={"type": "none"}, **GREEDY)
    assert [b.type for b in again.content] == ["text"] and again.content[0].text


CONVERSATION = [
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "two calls", "signature": "s"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris", "unit": "celsius"}},
        {"type": "tool_use", "id": "t2", "name": "get_time", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "18 C"},
        {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "12:"},
                                                                  {"type": "text", "text": "00"}]},
        {"type": "text", "text": "Thanks."}]}]
OPENAI_CONVERSATION = [
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "get_weather",
                                                       "arguments": '{"city": "Paris", "unit": "celsius"}'}},
        {"id": "t2", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "t1", "content": "18 C", "name": "get_weather"},
    {"role": "tool", "tool_call_id": "t2", "content": "12:00", "name": "get_time"},
    {"role": "user", "content": "Thanks."}]


def test_blocks_become_openai_messages_in_their_order():
    body = MessagesRequest.model_validate({"model": "m", "max_tokens": 4, "messages": CONVERSATION,
                                           "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "kind."}]})
    assert body.openai_messages() == [{"role": "system", "content": "Be kind."}] + OPENAI_CONVERSATION
    assert not body.prefilled
    ended = MessagesRequest.model_validate({"model": "m", "max_tokens": 4, "messages": [
        *CONVERSATION[:1], {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]}]})
    assert ended.openai_messages() == OPENAI_CONVERSATION[:1] and not ended.prefilled  # nothing to go on from


@pytest.mark.real
def test_a_conversation_with_calls_renders_as_its_openai_twin(served):
    counted = anth(served).messages.count_tokens(model="smol", messages=CONVERSATION, tools=TOOLS)
    oa = client(served).chat.completions.create(model="smol", messages=OPENAI_CONVERSATION, tools=[WEATHER, TIME],
                                                max_tokens=1, temperature=0)
    assert counted.input_tokens == oa.usage.prompt_tokens


@pytest.mark.real
def test_a_last_assistant_message_is_a_prefill(served):
    """The answer goes on from the assistant's text: the plain completion of the conversation rendered up
    to that text, token for token (the prefill itself is not repeated)."""
    begun = "The capital of France is"
    m = anth(served).messages.create(model="smol", max_tokens=8, **GREEDY, messages=[
        {"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": begun}])
    prompt = f"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n{begun}"
    oa = client(served).completions.create(model="smol", prompt=prompt, max_tokens=8, temperature=0)
    assert m.content[0].text and m.content[0].text == oa.choices[0].text
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == oa.usage.prompt_tokens


def test_the_prefill_cut_is_transformers():
    rendered = "<s>user: hi</s><s>assistant: The answer is</s>"
    assert up_to_final(rendered, "The answer is") == "<s>user: hi</s><s>assistant: The answer is"
    assert up_to_final("A: x  y \n</s>", "x  y ") == "A: x  y "  # kept whole: the trailing space too
    assert up_to_final("A: x  y</s>", "x  y ") == "A: x  y"  # the template trimmed it
    with pytest.raises(SpecdecError, match="cannot go on"):
        up_to_final("A: something else</s>", "The answer is")


@pytest.mark.real
def test_output_config_constrains_the_answer_to_the_schema(served):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"], "additionalProperties": False}
    for field in ({"output_config": {"format": {"type": "json_schema", "schema": schema}}},
                  {"output_format": {"type": "json_schema", "schema": schema}}):
        r = httpx.post(served + "/v1/messages", timeout=60, json={
            "model": "smol", "max_tokens": 60, "temperature": 0, **field,
            "messages": [{"role": "user", "content": "Name a colour, as JSON."}]}).json()
        assert r["stop_reason"] == "end_turn", r
        jsonschema.validate(json.loads(r["content"][0]["text"]), schema)


BAD = [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": 4, "messages": []}, "messages"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "'image'"),
    ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "needs text"),
    ({"max_tokens": 4, "messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "web_search_20250305"),
    ({"max_tokens": 4, "messages": ASK, "tools": [{"name": "f"}]}, "input_schema"),
    ({"max_tokens": 4, "messages": ASK, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
    ({"max_tokens": 4, "messages": ASK, "tool_choice": {"type": "any"}}, "needs tools"),
    ({"max_tokens": 4, "messages": ASK, "tools": TOOLS, "tool_choice": {"type": "sometimes"}}, "sometimes"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]}, "cannot hold tool_use"),
    ({"max_tokens": 4, "messages": ASK + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "get_time", "input": {}}]}]}, "tool_result"),
    ({"max_tokens": 4, "messages": ASK, "output_config": {"format": {"type": "json_schema"}}}, "output_format"),
    ({"max_tokens": 4, "messages": ASK, "tools": TOOLS, "tool_choice": {"type": "any"},
      "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "cannot both"),
    ({"max_tokens": 4, "messages": ASK, "stop_sequences": [""]}, "empty"),
]


@pytest.mark.real
@pytest.mark.parametrize("body, part", BAD)
def test_bad_bodies_are_anthropic_400s_naming_the_problem(served, body, part):
    r = httpx.post(served + "/v1/messages", json={"model": "smol"} | body, timeout=60)
    assert r.status_code == 400, r.text
    out = r.json()
    assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error", out
    assert part in out["error"]["message"], out


@pytest.mark.real
def test_a_wrong_model_and_bad_json_are_anthropic_errors(served):
    with pytest.raises(anthropic.NotFoundError, match="smol"):
        anth(served).messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=ASK)
    r = httpx.post(served + "/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.post(served + "/v1/messages/count_tokens", json={"model": "smol"}).json()["type"] == "error"


def test_claude_codes_billing_stamp_is_read_as_a_constant():
    """Its `cch=` stamp changes with every request; read as it is, no request's prompt would share more
    than the line's first tokens with the last one's."""
    def system(stamp: str) -> str:
        body = MessagesRequest.model_validate({"model": "m", "max_tokens": 4, "messages": ASK, "system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; "
                                     f"cch={stamp};"}, {"type": "text", "text": "You are Claude Code."}]})
        return body.openai_messages()[0]["content"]
    assert system("a5145") == system("ff01b") and "cch=00000;You are Claude Code." in system("a5145")
    other = MessagesRequest.model_validate({"model": "m", "max_tokens": 4, "messages": ASK,
                                            "system": "Keep cch=a5145; as it is."})
    assert other.openai_messages()[0]["content"] == "Keep cch=a5145; as it is."


def test_the_key_may_come_as_x_api_key_and_refusals_are_anthropics(guarded):  # noqa: F811
    base, _ = guarded
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "w1"}]}
    for headers in ({}, {"x-api-key": "wrong"}, {"x-api-key": "sekret2"}):
        r = httpx.post(base + "/v1/messages", json=body, headers=headers, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
    with pytest.raises(anthropic.AuthenticationError):
        anth(base, "wrong").messages.create(**body)
    out = anth(base, "sekret").messages.create(**body, **GREEDY)
    assert out.content[0].type == "text" and out.usage.output_tokens >= 1
    assert httpx.post(base + "/v1/chat/completions", headers={"x-api-key": "sekret"}, json={
        "model": "tiny", "messages": body["messages"], "max_tokens": 2}).status_code == 200
    key = {"x-api-key": "sekret"}
    big = body | {"messages": [{"role": "user", "content": "w1 " * 1200}]}
    r = httpx.post(base + "/v1/messages", json=big, headers=key)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    r = httpx.post(base + "/v1/messages", json=body | {"stop_sequences": ["longer"]}, headers=key)
    assert r.status_code == 400 and "stop" in r.json()["error"]["message"]
    r = httpx.post(base + "/v1/messages", json=body | {"messages": body["messages"] * 4}, headers=key)
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = httpx.post(base + "/v1/messages", json=body | {"tools": TOOLS}, headers=key)  # its template has no tools
    assert r.status_code == 400 and "tools" in r.json()["error"]["message"]


def drive(answer, events: list, stream: bool):
    """An answer object (Anthropic's or the Responses API's) over scheduler events given by hand: the
    whole answer, or the streamed events as (name, data) pairs."""
    import asyncio

    class Handle:
        def cancel(self):
            pass

    async def go():
        given = iter(events)

        async def next_event():
            return next(given)
        if not stream:
            return await answer.whole(next_event, Handle())
        chunks = [c async for c in answer.stream(next_event, Handle())]
        return [(c.split("\n")[0][7:], json.loads(c.split("\n")[1][6:])) for c in chunks]
    return asyncio.run(go())


def answered(events: list, stream: bool):
    from specdec.server.anthropic_api import MessagesAnswer
    from specdec.server.tools import HERMES
    return drive(MessagesAnswer("m", 7, HERMES), events, stream)


@pytest.mark.parametrize("pieces, text, calls", [
    (["Sure <tool_", "call>not json</tool_call>"], "Sure <tool_call>not json</tool_call>", []),
    (["Let me check.\n<tool_call>\n", '{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'],
     "Let me check.", [("get_time", {"city": "Oslo"})]),
    (["<tool", "_call>\n"], "<tool_call>\n", []),
])
def test_held_text_and_calls_stream_as_they_stand_whole(pieces, text, calls):
    """Text that might begin a call is held while streaming: it goes out as text where it was none,
    and a call as a tool_use block, as in the whole message."""
    from specdec.server.scheduler import Event
    usage = {"prompt_tokens": 7, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 2}}
    events = [Event("delta", pieces[0]), Event("done", pieces[1], finish_reason="stop", usage=usage)]
    whole = answered(events, stream=False)
    assert [b.get("text") for b in whole["content"] if b["type"] == "text"] == [text]
    assert [(b["name"], b["input"]) for b in whole["content"] if b["type"] == "tool_use"] == calls
    assert whole["stop_reason"] == ("tool_use" if calls else "end_turn")
    assert whole["usage"] | {"speculative": {}} == {"input_tokens": 5, "cache_read_input_tokens": 2,
                                                   "cache_creation_input_tokens": 0, "output_tokens": 5,
                                                   "speculative": {}}
    streamed = answered(events, stream=True)
    sent = "".join(d["delta"]["text"] for n, d in streamed if n == "content_block_delta"
                   and d["delta"]["type"] == "text_delta")
    inputs = [json.loads(d["delta"]["partial_json"]) for n, d in streamed if n == "content_block_delta"
              and d["delta"]["type"] == "input_json_delta"]
    starts = [d["content_block"] for n, d in streamed if n == "content_block_start"]
    assert sent.strip() == text.strip()  # (the text before a call may keep its line end when streamed)
    assert [(b["name"], i) for b, i in zip([b for b in starts if b["type"] == "tool_use"], inputs)] == calls
    assert [d["index"] for n, d in streamed if n == "content_block_start"] == list(range(len(starts)))
    assert streamed[-2][1]["delta"]["stop_reason"] == whole["stop_reason"]


@pytest.mark.real
def test_the_agent_bench_turns_run_against_this_server(served):
    """scripts/agent_bench.py's requests (a forced write_file call after a read_file result) against this
    server: plain and drafting, the same call."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("agent_bench", Path(__file__).parents[1] / "scripts/agent_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    task = bench.tasks(2)[1]
    assert task["messages"][-1]["content"][0]["content"].lstrip().startswith("def ")
    rows = [bench.turn(served, "smol", task, 24, plain) for plain in (True, False)]
    assert all(r["output_tokens"] <= 24 and r["stop_reason"] in ("tool_use", "max_tokens") for r in rows)
    assert rows[0]["content"][-1] | {"id": ""} == rows[1]["content"][-1] | {"id": ""}


@pytest.mark.real
def test_a_prompt_past_the_context_is_an_anthropic_400(served):
    long = {"model": "smol", "max_tokens": 8, "messages": [{"role": "user", "content": "word " * 2000}]}
    r = httpx.post(served + "/v1/messages", json=long, timeout=60)
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert "context" in r.json()["error"]["message"]
    assert anth(served).messages.count_tokens(model="smol", messages=long["messages"]).input_tokens > 1024
