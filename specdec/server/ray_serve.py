"""`specdec serve --ray`: specdec replicas under Ray Serve, behind one OpenAI-compatible front.

- `Replica` (a Ray Serve deployment, one per replica, placed by Ray): a whole `specdec serve`
  engine (target, drafter, policy, slots, prefix cache) with its own app; the front hands it each
  request as it came (method, path, JSON body) and gets the app's answer back, streamed or whole.
  So every replica answers exactly as one `specdec serve` would, validation errors included.
- `Front` (the ingress): the API's paths; it routes, retries and counts. It checks the API key and
  the body-size cap as `specdec serve` does (guard.Guard); the replicas, reached only through it,
  check the other request limits.
- `ConversationRouter` (the replicas' Ray Serve request router): a request of a conversation goes
  to the replica that served the conversation before, while that replica has a free slot (its
  prefix cache and suffix cache hold the conversation); otherwise to the replica with the fewest
  ongoing requests. A replica takes at most --max-batch requests (one per slot), so stickiness
  never queues a request behind a full replica. A conversation is the request's `user` field,
  else a hash of its messages up to the first user message (chat; Anthropic's with its system) or of
  its prompt's start.

Faults: a request whose replica dies before it streamed a token is retried once on another
replica; one that had streamed tokens ends with an error event. Ray restarts the replica. The
front counts every request sent, answered, failed and retried, per replica and in all (`/metrics`).
"""

# no `from __future__ import annotations`: the ingress routes are pickled by value, and FastAPI must see
# their annotations as classes, not names

import asyncio
import hashlib
import json
import logging
import signal
import time

from fastapi import FastAPI, Request  # at module level: the routes' annotations are resolved here
from fastapi.responses import Response, StreamingResponse

from specdec.errors import SpecdecError
from specdec.server import build_scheduler
from specdec.server.app import create_app
from specdec.server.guard import Access, Guard
from specdec.server.protocol import ANTHROPIC_PATHS, anthropic_error, error_json
from specdec.settings import DraftingSettings, ModelSettings, RaySettings, ServeSettings

log = logging.getLogger("specdec.ray")

def conversation_key(path: str, body: dict) -> str:
    """The `user` field, else a hash of the messages up to the first user message (chat; Anthropic's
    messages with their system; the Responses API's input with its instructions) or of the prompt's first
    256 characters (completions): what every turn of one conversation starts with."""
    user = body.get("user")
    if isinstance(user, str) and user:
        return "user:" + user
    if path.endswith(("chat/completions", "/messages", "/responses")):  # the messages up to the first user message
        system = body.get("system") or body.get("instructions")  # (and Anthropic's system, the Responses API's
        head = [["system", system]] if system else []  # instructions): every turn starts so
        items = body.get("input") if path.endswith("/responses") else body.get("messages")
        for m in [{"role": "user", "content": items}] if isinstance(items, str) else items or []:
            if isinstance(m, dict):
                head.append([m.get("role"), m.get("content")])
                if m.get("role") == "user":
                    break
        text = json.dumps(head, sort_keys=True, default=str)
    else:
        text = json.dumps(body.get("prompt"), default=str)[:256]
    return "hash:" + hashlib.sha1(text.encode()).hexdigest()[:16]


def ray_installed() -> bool:
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        return False
    return True


def check_ray(ray: RaySettings) -> tuple[int, int]:
    """(min, max) replicas; clear errors before Ray starts."""
    if not ray_installed():
        raise SpecdecError("--ray needs Ray Serve, an optional extra: pip install -e '.[ray]'")
    return ray.replica_range()


def check_reachable(address: str) -> None:
    """A clear error, at once, when nothing listens at a host:port cluster address."""
    import socket
    host, _, port = address.rpartition(":")
    if not port.isdigit() or "://" in address:
        return  # 'auto', a ray:// client address: Ray itself resolves those
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as e:
        raise SpecdecError(f"cannot reach the Ray cluster at {address}: {e}; start it with `ray start --head` "
                           "or give the address `ray status` prints") from None


def start_ray(address: str | None) -> None:
    """Join the cluster at `address`, or start a local Ray bound to loopback."""
    import ray
    if address:
        check_reachable(address)
    if ray.is_initialized():
        return
    try:
        if address:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        else:
            ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, logging_level=logging.WARNING,
                     log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        raise SpecdecError(f"cannot reach {where}: {e}") from None


def check_capacity(max_replicas: int, cpus: float) -> None:
    import ray
    have = ray.cluster_resources().get("CPU", 0.0)
    if max_replicas * cpus > have:
        raise SpecdecError(f"{max_replicas} replicas x {cpus:g} CPUs need {max_replicas * cpus:g} CPUs; the Ray "
                           f"cluster has {have:g}. Lower --replicas / --autoscale MAX or --cpus-per-replica")


def build_app(model: ModelSettings, drafting: DraftingSettings, srv: ServeSettings, ray: RaySettings,
              lo: int, hi: int):
    """The Ray Serve application: the front bound to the replicas."""
    from ray import serve
    from ray.serve.config import AutoscalingConfig, RequestRouterConfig
    replica_cls = serve.deployment(name="specdec-replica", max_ongoing_requests=srv.max_batch,
                                   graceful_shutdown_timeout_s=srv.shutdown_grace + 5.0, health_check_period_s=2.0,
                                   health_check_timeout_s=30.0)(Replica)
    up, down = ray.delays()
    scaling = {"num_replicas": lo} if lo == hi else {"autoscaling_config": AutoscalingConfig(
        min_replicas=lo, max_replicas=hi, target_ongoing_requests=max(1, srv.max_batch // 2),
        upscale_delay_s=up, downscale_delay_s=down, look_back_period_s=min(30.0, max(1.0, up)))}
    router = {} if ray.ray_routing == "least-loaded" else {"request_router_config": RequestRouterConfig(
        request_router_class="specdec.server.ray_router:ConversationRouter")}  # else Ray Serve's own (power of two)
    threads = max(1, int(ray.cpus_per_replica))  # a replica computes on its share of the CPUs
    replica = replica_cls.options(ray_actor_options={"num_cpus": ray.cpus_per_replica}, **router,
                                  **scaling).bind(model, drafting, srv, threads)
    ingress = make_front(front_app(srv.access(), srv.max_body_bytes))
    front = serve.deployment(name="specdec-front", ray_actor_options={"num_cpus": 0},
                             max_ongoing_requests=100_000)(ingress)
    return front.bind(replica, srv.served_model_name or model.model)


class Replica:
    """One whole specdec engine and its app; the front hands it requests as they came."""

    def __init__(self, model: ModelSettings, drafting: DraftingSettings, srv: ServeSettings, threads: int):
        import httpx
        from ray import serve
        import torch
        torch.set_num_threads(threads)
        self.grace = srv.shutdown_grace
        self.scheduler = build_scheduler(model, drafting, srv, progress=lambda m: log.info("%s", m))
        self.scheduler.start()
        app = self.app = create_app(self.scheduler, srv.served_model_name or model.model, limits=srv.limits())
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replica", timeout=None)
        self.id = serve.get_replica_context().replica_id.unique_id

    @staticmethod
    def _headers(r) -> dict:
        return {k: v for k, v in r.headers.items() if k.lower() in ("retry-after", "content-type")}

    async def call(self, path: str, body, conversation: str = "") -> dict:
        """body None: a GET of the path."""
        if body is None:
            r = await self.client.get(path)
        elif isinstance(body, str):
            r = await self.client.post(path, content=body, headers={"content-type": "application/json"})
        else:
            r = await self.client.post(path, json=body)
        return {"status": r.status_code, "body": r.content, "replica": self.id, "headers": self._headers(r)}

    async def stream(self, path: str, body, conversation: str = ""):
        """The app's answer as it is sent: the ASGI messages go straight to the front (an httpx
        ASGI transport would gather the whole body first)."""
        raw = json.dumps(body).encode()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
                 "client": ("127.0.0.1", 0), "server": ("replica", 80)}
        messages: asyncio.Queue = asyncio.Queue()
        request = [{"type": "http.request", "body": raw, "more_body": False}]

        async def receive():
            if request:
                return request.pop()
            await asyncio.Event().wait()  # no disconnect while the front reads (a cancel ends it)

        task = asyncio.ensure_future(self.app(scope, receive, messages.put))
        try:
            start = await messages.get()
            headers = {k.decode(): v.decode() for k, v in start.get("headers", [])
                       if k.decode().lower() in ("retry-after", "content-type")}
            yield {"status": start["status"], "replica": self.id, "headers": headers}
            while True:
                msg = await messages.get()
                if msg.get("body"):
                    yield msg["body"].decode()
                if not msg.get("more_body"):
                    break
            await task
        finally:
            if not task.done():
                task.cancel()  # the client went away: the app cancels the request

    def metrics(self) -> tuple[str, bytes]:
        return self.id, self.scheduler.metrics.render()

    def check_health(self) -> None:
        if not self.scheduler.alive:
            raise RuntimeError("the replica's scheduler thread died")

    def __del__(self):
        try:
            self.scheduler.drain(self.grace)
            self.scheduler.stop()
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass


class FrontCounts:
    """Requests the front sent, answered, failed and retried, per replica and in all."""

    def __init__(self):
        self.total = {"sent": 0, "answered": 0, "failed": 0, "retried": 0}
        self.per_replica: dict[str, dict[str, int]] = {}

    def add(self, what: str, replica: str | None = None) -> None:
        self.total[what] += 1
        if replica is not None:
            row = self.per_replica.setdefault(replica, {"answered": 0, "failed": 0, "retried": 0})
            row[what] = row.get(what, 0) + 1

    def prometheus(self) -> str:
        lines = []
        for what, n in self.total.items():
            lines += [f"# TYPE specdec_front_{what}_total counter", f"specdec_front_{what}_total {n}"]
            lines += [f'specdec_front_{what}_total{{replica="{rid}"}} {row[what]}'
                      for rid, row in sorted(self.per_replica.items()) if what in row]
        return "\n".join(lines) + "\n"


def _error(message: str) -> dict:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": "replica_failed"}}


def _replica_died(e: Exception) -> bool:
    from ray import exceptions as rex
    return isinstance(e, (rex.RayActorError, rex.ActorDiedError, rex.ActorUnavailableError))


class FrontForwarding:
    """What the ingress does with a request: forward it to a replica (the router picks it); a
    request whose replica died before it answered is retried once on another; everything counted."""

    def __init__(self, replica, model_name: str):
        self.replica = replica
        self.model_name = model_name
        self.counts = FrontCounts()

    async def forward(self, request: Request, path: str):
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = raw.decode(errors="replace")  # the replica answers it as specdec serve does
        key = conversation_key(path, body) if isinstance(body, dict) else "none"
        self.counts.add("sent")
        if isinstance(body, dict) and body.get("stream") is True:
            return StreamingResponse(self.stream(path, body, key), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        for attempt in (0, 1):
            try:
                out = await self.replica.call.remote(path, body, conversation=key)
            except Exception as e:  # noqa: BLE001 - a replica failure: retried once, then a clear error
                if attempt == 0 and _replica_died(e):
                    self.counts.add("retried")
                    continue
                self.counts.add("failed")
                return error_json(path, 502, _error(f"the replica failed: {type(e).__name__}: {e}"))
            self.counts.add("answered" if out["status"] < 500 else "failed", out["replica"])
            return Response(out["body"], status_code=out["status"],
                            headers={**out["headers"], "x-specdec-replica": out["replica"]})

    async def stream(self, path: str, body: dict, key: str):
        for attempt in (0, 1):
            streamed, replica = False, None
            try:
                async for item in self.replica.options(stream=True).stream.remote(path, body, conversation=key):
                    if isinstance(item, dict):
                        replica = item["replica"]
                        yield f": replica {replica}\n\n"  # an SSE comment: which replica answers
                        continue
                    streamed = True
                    yield item
                self.counts.add("answered", replica)
                return
            except Exception as e:  # noqa: BLE001
                if attempt == 0 and not streamed and _replica_died(e):
                    self.counts.add("retried", replica)
                    continue
                self.counts.add("failed", replica)
                message = f"the replica failed mid-stream: {type(e).__name__}: {e}"
                if path.startswith(ANTHROPIC_PATHS):
                    yield f"event: error\ndata: {json.dumps(anthropic_error(500, message))}\n\n"
                    return
                yield f"data: {json.dumps(_error(message))}\n\n"
                yield "data: [DONE]\n\n"
                return


def front_app(access: Access, max_body_bytes: int) -> FastAPI:
    """The front's FastAPI app, behind the same Guard as `specdec serve` (the API key, the body cap)."""
    app = FastAPI(title="specdec", docs_url=None, redoc_url=None)
    app.add_middleware(Guard, access=access, max_body_bytes=max_body_bytes)
    return app


def make_front(app: FastAPI):
    """The ingress class: the API's paths, on `app` (front_app), over FrontForwarding (Ray Serve is
    imported only here)."""
    from ray import serve

    @serve.ingress(app)
    class Front(FrontForwarding):
        @app.post("/v1/completions")
        async def completions(self, request: Request):
            return await self.forward(request, "/v1/completions")

        @app.post("/v1/chat/completions")
        async def chat(self, request: Request):
            return await self.forward(request, "/v1/chat/completions")

        @app.post("/v1/messages")
        async def messages(self, request: Request):
            return await self.forward(request, "/v1/messages")

        @app.post("/v1/messages/count_tokens")
        async def count_tokens(self, request: Request):
            return await self.forward(request, "/v1/messages/count_tokens")

        @app.post("/v1/responses")
        async def responses(self, request: Request):
            return await self.forward(request, "/v1/responses")

        @app.post("/tokenize")
        async def tokenize(self, request: Request):
            return await self.forward(request, "/tokenize")

        @app.post("/detokenize")
        async def detokenize(self, request: Request):
            return await self.forward(request, "/detokenize")

        @app.get("/tokenizer_info")
        async def tokenizer_info(self):
            out = await self.replica.call.remote("/tokenizer_info", None, conversation="none")
            return Response(out["body"], status_code=out["status"], headers=out["headers"])

        @app.get("/v1/models")
        async def models(self):
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                                "owned_by": "specdec"}]}

        @app.get("/health")
        async def health(self):
            return {"status": "ok"}

        @app.get("/metrics")
        async def metrics(self):
            return Response(self.counts.prometheus(), media_type="text/plain; version=0.0.4")

        @app.get("/stats")
        async def stats(self):
            return {"front": self.counts.total, "replicas": self.counts.per_replica}

    return Front


def serve_ray(model: ModelSettings, drafting: DraftingSettings, srv: ServeSettings, ray: RaySettings) -> int:
    """Start (or join) Ray, deploy, serve until SIGTERM/SIGINT, then drain for --shutdown-grace."""
    lo, hi = check_ray(ray)
    start_ray(ray.ray_address)
    check_capacity(hi, ray.cpus_per_replica)
    from ray import serve
    serve.start(http_options={"host": srv.host, "port": srv.port})
    serve.run(build_app(model, drafting, srv, ray, lo, hi), name="specdec", route_prefix="/", blocking=False)
    log.warning("specdec on Ray Serve at http://%s:%d (%s replicas)", srv.host, srv.port,
                lo if lo == hi else f"{lo}..{hi}")
    stop = [False]

    def on_signal(sig, frame):
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop[0]:
        time.sleep(0.5)
    serve.delete("specdec")  # the replicas drain for their graceful_shutdown_timeout_s
    serve.shutdown()
    return 0
