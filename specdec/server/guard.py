"""What a request passes before the API reads it, and the limits on what it may ask (the two objects,
Access and RequestLimits, are settings: specdec.settings builds them from the serve flags).

- Access: with an API key (`--api-key`, or $SPECDEC_API_KEY), every path but /health (every /v1/
  route, /openapi.json, unknown paths) needs the header `Authorization: Bearer KEY` (or Anthropic's
  `x-api-key: KEY`), else 401 in OpenAI's error shape (Anthropic's on its /v1/messages paths); /stats and /metrics need it only with `--api-key-protects-stats`. The key is
  compared in constant time.
- RequestLimits: a body longer than `--max-body-bytes` is 413 (at once by its Content-Length, else
  as it arrives); a stop string longer than `--max-stop-length` characters and more than
  `--max-messages` messages are 400s naming the field (the endpoints ask `violation`).

`specdec serve` and the Ray front (ray_serve.py) install the same Guard middleware.
"""

from __future__ import annotations

import ipaddress

from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from specdec.server.protocol import error_body, error_json
from specdec.settings import API_KEY_ENV, Access, RequestLimits  # noqa: F401 (RequestLimits re-exported for the app)


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (a name other than localhost may resolve anywhere)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, access: Access) -> str | None:
    """One line to print when the API listens beyond loopback with no key; None otherwise."""
    if access.api_key is not None or is_loopback(host):
        return None
    return (f"specdec: warning: serving on {host} with no API key: anyone who can reach it can use the API; "
            f"set --api-key or ${API_KEY_ENV}")


def refusal(path: str, status: int, message: str, code: str, headers: dict | None = None) -> JSONResponse:
    return error_json(path, status, error_body(message, code=code), headers)


class Guard:
    """ASGI middleware: the API key where Access needs one (401), then the body-size cap (413). The
    body is read here, up to the cap, and handed on whole; later receives (a client's disconnect)
    go straight through."""

    def __init__(self, app, access: Access, max_body_bytes: int):
        self.app, self.access, self.max_body_bytes = app, access, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path = scope["path"]
        if self.access.needs_key(path) and not self.access.allows(headers.get("authorization"),
                                                                  headers.get("x-api-key")):
            return await self.unauthorized(path, headers)(scope, receive, send)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            return await self.too_large(path)(scope, receive, send)
        try:
            body = await read_body(receive, self.max_body_bytes)
        except ClientDisconnect:
            return  # no one to answer
        if body is None:
            return await self.too_large(path)(scope, receive, send)
        await self.app(scope, replay(body, receive), send)

    @staticmethod
    def unauthorized(path: str, headers: dict) -> JSONResponse:
        message = ("incorrect API key provided" if headers.get("authorization") or headers.get("x-api-key") else
                   "this server needs an API key: send the header 'Authorization: Bearer KEY' (or 'x-api-key: KEY')")
        return refusal(path, 401, message, "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def too_large(self, path: str) -> JSONResponse:
        return refusal(path, 413, f"the request body is larger than this server's limit of {self.max_body_bytes} "
                                  "bytes", "request_too_large")


async def read_body(receive, limit: int) -> bytes | None:
    """The request's body, or None once it passes `limit` bytes (the rest is left unread)."""
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        parts.append(message.get("body", b""))
        size += len(parts[-1])
        if size > limit:
            return None
        if not message.get("more_body", False):
            return b"".join(parts)


def replay(body: bytes, receive):
    """A receive that gives `body` first, then whatever the client sends next."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed():
        return pending.pop() if pending else await receive()
    return replayed
