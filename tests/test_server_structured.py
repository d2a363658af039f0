"""Structured output behind the server, on the real SmolLM2-135M with a draft (itself) under the policy:
the OpenAI SDK's `parse` with a pydantic model; vLLM's and llama-server's fields; the answer equals the
engine's constrained greedy output; bad constraints are 400s naming the problem; a constraint cut by
max_tokens ends with finish_reason "length"."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import BaseModel

from specdec.config import GenerationConfig
from specdec.constraints import ConstraintSpec, Grammars
from specdec.engine.engine import Engine
from specdec.model.tokenizer import encode_messages
from specdec.server import build_scheduler
from tests.test_server import client, running, serve_args

pytestmark = pytest.mark.real
CONTEXT = 1024


class Person(BaseModel):
    name: str
    age: int
    city: str


@pytest.fixture(scope="module")
def served(smollm2_path):
    sched = build_scheduler(*serve_args("--model", str(smollm2_path), "--draft", str(smollm2_path), "--k", "4",
                                       "--device", "cpu", "--max-context", str(CONTEXT), "--max-batch", "2",
                                       "--policy", "fixed"), progress=lambda m: None)
    with running(sched, "smol") as (base, _):
        yield base, sched


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_sdk_parse_gives_a_valid_object_equal_to_the_engines(served):
    base, sched = served
    messages = ask("Invent a person. Give their name, age and city as JSON.")
    out = client(base).beta.chat.completions.parse(model="smol", messages=messages, response_format=Person,
                                                   max_tokens=80, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Person)
    # the engine's own constrained greedy output, with the same drafter, gives the same text
    grammars = Grammars.for_tokenizer(sched.tokenizer, sched.engine.target.config.vocab_size, sched.eos_ids)
    schema = Person.model_json_schema()
    ids = encode_messages(sched.tokenizer, messages)
    engine = Engine.single(sched.engine.target, sched.engine.drafter, CONTEXT)
    ref = engine.generate(ids, GenerationConfig(80, 4), sched.eos_ids,
                          constraint=grammars.constraint(ConstraintSpec("json_schema", schema)))
    assert choice.message.content == sched.tokenizer.decode(ref.tokens, skip_special_tokens=True)


@pytest.mark.parametrize("field, value, check", [
    ("structured_outputs", {"regex": "[0-9]{3}-[0-9]{4}"}, lambda t: len(t) == 8 and t[3] == "-"),
    ("guided_choice", ["yes", "no"], lambda t: t in ("yes", "no")),
    ("json_schema", {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
     lambda t: isinstance(json.loads(t)["ok"], bool)),
    ("grammar", 'root ::= "red" | "green" | "blue"', lambda t: t in ("red", "green", "blue")),
    ("response_format", {"type": "json_object"}, lambda t: isinstance(json.loads(t), dict)),
])
def test_each_structured_field_constrains_the_completion(served, field, value, check):
    base, _ = served
    r = httpx.post(base + "/v1/completions", json={"model": "smol", "prompt": "Answer: ", "max_tokens": 60,
                                                   "temperature": 0, field: value}, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and check(choice["text"]), choice


def test_a_constraint_cut_by_max_tokens_ends_with_length(served):
    base, _ = served
    r = httpx.post(base + "/v1/chat/completions", json={
        "model": "smol", "messages": ask("Write a long list."), "max_tokens": 5, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "l", "schema": {
            "type": "array", "items": {"type": "string"}, "minItems": 20}}}}, timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("change, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "json_schema"),
    ({"guided_regex": "(unclosed"}, "regex"),
    ({"grammar": "root ::= ("}, "grammar"),
    ({"guided_choice": []}, "choice"),
    ({"response_format": {"type": "xml"}}, "xml"),
    ({"response_format": {"type": "json_schema"}}, "json_schema.schema"),
    ({"guided_regex": "a", "grammar": 'root ::= "a"'}, "one structured-output field"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one"),
])
def test_bad_constraints_are_400s_that_name_the_problem(served, change, message):
    base, _ = served
    body = {"model": "smol", "messages": ask("hi"), "max_tokens": 4} | change
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"]


def test_concurrent_structured_requests_get_their_own_answers(served):
    """Two requests under different grammars in one batch (their chains verified in one forward, each
    under its own masks) get what each gets alone."""
    from concurrent.futures import ThreadPoolExecutor
    base, _ = served
    bodies = [{"model": "smol", "prompt": "Answer: ", "max_tokens": 40, "temperature": 0,
               "structured_outputs": {"regex": "(ab|cd){3,6}"}},
              {"model": "smol", "prompt": "A list: ", "max_tokens": 40, "temperature": 0,
               "json_schema": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 5}}]

    def post(body):
        r = httpx.post(base + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]
    alone = [post(b) for b in bodies]
    with ThreadPoolExecutor(2) as ex:
        together = list(ex.map(post, bodies * 2))
    assert together == alone * 2
    assert len(json.loads(alone[1])) >= 2 and set(alone[0]) <= set("abcd")
