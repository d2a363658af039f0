"""`specdec serve --ray`: two SmolLM2-135M replicas (n-gram drafting, 1 CPU each) under Ray Serve on a
local cluster bound to loopback. The API through the official client, conversation-aware routing,
a replica killed under load (nothing lost, the replica comes back), the bad-input errors, and the
front's API-key and body-size checks."""

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")

from specdec.cli import build_parser, main  # noqa: E402
from specdec.flags import serve_settings  # noqa: E402
from specdec.errors import SpecdecError  # noqa: E402
from specdec.server import ray_serve  # noqa: E402

pytestmark = pytest.mark.real
MODEL = "smollm2-135m-instruct"
MAX_NEW = 12
KEY = "ray-sekret"  # the cluster's front needs it on /v1/ (guard.py)
AUTH = {"Authorization": f"Bearer {KEY}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_args(*extra):
    return build_parser().parse_args(["serve", "--ray", "--model", MODEL, "--ngram", "--max-batch", "2",
                                      "--max-context", "1024", "--policy", "fixed", "--device", "cpu",
                                      *extra])


def replicas_running() -> int:
    app = serve.status().applications.get("specdec")
    if app is None or "specdec-replica" not in app.deployments:
        return 0
    return app.deployments["specdec-replica"].replica_states.get("RUNNING", 0)


@pytest.fixture(scope="module")
def cluster(smollm2_path):
    port = free_port()
    model, drafting, srv, ray_settings = serve_settings(serve_args("--replicas", "2", "--port", str(port),
                                                                   "--api-key", KEY))
    lo, hi = ray_serve.check_ray(ray_settings)
    ray_serve.start_ray(None)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(ray_serve.build_app(model, drafting, srv, ray_settings, lo, hi), name="specdec", route_prefix="/", blocking=False)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    while replicas_running() < 2 and time.time() < deadline:
        time.sleep(1)
    assert replicas_running() == 2
    yield base
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def reference(smollm2):
    """Greedy answers of one plain engine (the replicas draft by n-gram lookup: the same tokens)."""
    from specdec.config import GenerationConfig
    from specdec.drafters.base import NoDrafter
    from specdec.engine.engine import Engine
    from specdec.model.tokenizer import encode_prompt
    engine = Engine.single(smollm2.module, NoDrafter(), 1024)

    def answer(prompt: str) -> str:
        ids = encode_prompt(smollm2.tokenizer, prompt, False)
        out = engine.generate(ids, GenerationConfig(MAX_NEW, 1), smollm2.eos_ids).tokens
        return smollm2.tokenizer.decode(out, skip_special_tokens=True)

    return answer


def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=120)


def test_concurrent_streaming_and_whole_answers(cluster, reference):
    prompts = [f"Count from {i} to {i + 5}:" for i in range(6)]
    c = client(cluster)

    def one(i):
        p = prompts[i]
        if i % 2:
            parts = c.completions.create(model=MODEL, prompt=p, max_tokens=MAX_NEW, temperature=0, stream=True)
            return "".join(ch.choices[0].text for ch in parts if ch.choices)
        return c.completions.create(model=MODEL, prompt=p, max_tokens=MAX_NEW, temperature=0).choices[0].text

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(one, range(len(prompts))))
    assert got == [reference(p) for p in prompts]
    models = httpx.get(cluster + "/v1/models", headers=AUTH).json()
    assert models["data"][0]["id"] == MODEL and httpx.get(cluster + "/health").status_code == 200
    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4)
    assert chat.choices[0].message.content
    bad = httpx.post(cluster + "/v1/chat/completions", headers=AUTH,
                     json={"model": MODEL, "messages": [{"role": "user", "content": None}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages.0"
    hi = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]}
    said = httpx.post(cluster + "/v1/messages", headers={"x-api-key": KEY}, json=hi, timeout=120)  # Anthropic's
    assert said.status_code == 200 and said.json()["content"][0]["type"] == "text", said.text
    with httpx.stream("POST", cluster + "/v1/messages", headers={"x-api-key": KEY}, json=hi | {"stream": True},
                      timeout=120) as r:
        names = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    missing = httpx.post(cluster + "/v1/messages", headers={"x-api-key": KEY}, json={"model": MODEL, "messages": []})
    assert missing.status_code == 400 and missing.json()["type"] == "error"
    answered = c.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4)  # the Responses API
    assert answered.output[0].type == "message" and answered.usage.output_tokens == 4


def test_a_conversation_is_keyed_by_its_start():
    key, turn = ray_serve.conversation_key, [{"role": "user", "content": "a"}]
    later = turn + [{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert key("/v1/chat/completions", {"messages": later}) == key("/v1/chat/completions", {"messages": turn})
    assert key("/v1/messages", {"system": "s", "messages": later}) == key("/v1/messages", {"system": "s",
                                                                                           "messages": turn})
    assert key("/v1/messages", {"system": "s", "messages": turn}) != key("/v1/messages", {"system": "t",
                                                                                          "messages": turn})
    assert key("/v1/messages", {"user": "u", "messages": turn}) == "user:u"
    assert key("/v1/responses", {"input": "a", "instructions": "s"}) == key("/v1/responses", {
        "input": later, "instructions": "s"}) == key("/v1/messages", {"system": "s", "messages": turn})


def test_a_conversations_turns_land_on_one_replica(cluster):
    homes = {}
    for conversation in range(4):
        messages = [{"role": "user", "content": f"Tell me about the number {conversation}."}]
        for turn in range(3):
            r = httpx.post(cluster + "/v1/chat/completions", timeout=120, headers=AUTH,
                           json={"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0})
            assert r.status_code == 200, r.text
            homes.setdefault(conversation, set()).add(r.headers["x-specdec-replica"])
            messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "And then?"}]
            if turn:
                assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, (homes, r.json()["usage"])
    assert all(len(h) == 1 for h in homes.values()), homes
    assert len(set().union(*homes.values())) == 2  # new conversations spread over both replicas


def test_a_replica_killed_under_load_loses_no_request(cluster):
    before = httpx.get(cluster + "/stats").json()["front"]
    results = []

    def one(i):
        body = {"model": MODEL, "prompt": f"Write a list of {i + 3} fruits:", "max_tokens": 24, "temperature": 0}
        if i % 2:
            with httpx.stream("POST", cluster + "/v1/completions", json=body | {"stream": True}, timeout=180,
                              headers=AUTH) as r:
                events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            errors = [e for e in events if e != "[DONE]" and "error" in json.loads(e)]
            return "error" if errors else ("ok" if events and events[-1] == "[DONE]" else "lost")
        r = httpx.post(cluster + "/v1/completions", json=body, timeout=180, headers=AUTH)
        return "ok" if r.status_code == 200 else ("error" if r.json().get("error", {}).get("message") else "lost")

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(8)]
        time.sleep(1.0)
        victim = next(a for a in ray.util.list_named_actors(all_namespaces=True) if "specdec-replica" in a["name"])
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=False)
        results = [f.result() for f in futures]
    assert "lost" not in results and results.count("ok") >= 4, results
    after = httpx.get(cluster + "/stats").json()["front"]
    sent = after["sent"] - before["sent"]
    print("fault test:", {k: after[k] - before[k] for k in after}, results)
    assert sent == 8 and sent == (after["answered"] - before["answered"]) + (after["failed"] - before["failed"])
    deadline = time.time() + 180
    while replicas_running() < 2 and time.time() < deadline:
        time.sleep(1)
    assert replicas_running() == 2  # Ray brought the replica back
    assert httpx.post(cluster + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2},
                      timeout=120, headers=AUTH).status_code == 200


def test_the_front_needs_the_api_key(cluster):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(cluster + "/v1/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(cluster + "/v1/models", headers=headers).status_code == 401
    assert httpx.get(cluster + "/health").status_code == 200 and httpx.get(cluster + "/stats").status_code == 200
    r = httpx.post(cluster + "/v1/completions", content=b"x" * (5 << 20), headers=AUTH, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_bad_ray_input_is_a_clear_error(cluster, capsys, monkeypatch):
    assert main(["serve", "--ray", "--model", MODEL, "--ray-address", f"127.0.0.1:{free_port()}"]) != 0
    assert "cannot reach the Ray cluster" in capsys.readouterr().err
    assert main(["serve", "--ray", "--model", MODEL, "--replicas", "5"]) != 0  # the cluster has 2 CPUs
    assert "5 replicas x 1 CPUs need 5 CPUs" in capsys.readouterr().err
    assert main(["serve", "--ray", "--model", MODEL, "--replicas", "2", "--autoscale", "1:3"]) != 0
    assert "not both" in capsys.readouterr().err
    assert main(["serve", "--ray", "--model", MODEL, "--autoscale", "three"]) != 0
    assert "MIN:MAX" in capsys.readouterr().err
    monkeypatch.setattr(ray_serve, "ray_installed", lambda: False)
    assert main(["serve", "--ray", "--model", MODEL]) != 0
    assert "pip install -e '.[ray]'" in capsys.readouterr().err


def test_the_front_checks_the_api_key_and_the_body_cap():
    """The front's app (no cluster: a route it reaches cannot answer outside Ray, a 500 here) turns
    away a request without the key (401) and a body over the cap (413) before any route."""
    import asyncio
    from specdec.server.guard import Access
    app = ray_serve.front_app(Access("sekret"), 100)
    ray_serve.make_front(app)

    async def status(method, path, key=None, body=b""):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(transport=transport, base_url="http://front", headers=headers) as c:
            return (await c.request(method, path, content=body)).status_code

    calls = [("GET", "/v1/models"), ("POST", "/v1/completions", "wrong"), ("GET", "/v1/nothing"),
             ("POST", "/v1/chat/completions", "sekret", b"x" * 101), ("GET", "/health"), ("GET", "/stats"),
             ("GET", "/v1/models", "sekret"), ("POST", "/tokenize"), ("POST", "/detokenize", "wrong"),
             ("GET", "/tokenizer_info")]

    async def statuses():
        return [await status(*call) for call in calls]

    assert asyncio.run(statuses()) == [401, 401, 401, 413, 500, 500, 500, 401, 401, 401]
    assert {"/tokenize", "/detokenize", "/tokenizer_info"} <= set(app.openapi()["paths"])  # the same routes as serve
