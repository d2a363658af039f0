"""`specdec serve --ray --autoscale 1:2`: under load the deployment grows to two replicas, and back to one when
the load stops (short --autoscale-delays so that the test sees both); every request is answered meanwhile."""

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from specdec.cli import build_parser  # noqa: E402
from specdec.errors import SpecdecError  # noqa: E402
from specdec.flags import serve_settings  # noqa: E402
from specdec.server import ray_serve  # noqa: E402

pytestmark = pytest.mark.real
MODEL = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replicas_running() -> int:
    app = serve.status().applications.get("specdec")
    if app is None or "specdec-replica" not in app.deployments:
        return 0
    return app.deployments["specdec-replica"].replica_states.get("RUNNING", 0)


def wait_for_replicas(n: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if replicas_running() == n:
            return True
        time.sleep(0.5)
    return False


def test_bad_autoscale_delays_are_a_clear_error():
    args = build_parser().parse_args(["serve", "--ray", "--model", MODEL, "--autoscale", "1:2",
                                      "--autoscale-delays", "soon"])
    with pytest.raises(SpecdecError, match="--autoscale-delays takes UP:DOWN"):
        serve_settings(args)


def test_autoscale_grows_under_load_and_shrinks_after(smollm2_path):
    port = free_port()
    args = build_parser().parse_args(["serve", "--ray", "--model", MODEL, "--ngram", "--max-batch", "2",
                                      "--max-context", "512", "--policy", "fixed", "--device", "cpu",
                                      "--autoscale", "1:2", "--autoscale-delays", "1:6", "--port", str(port)])
    model, drafting, srv, ray_settings = serve_settings(args)
    lo, hi = ray_serve.check_ray(ray_settings)
    assert (lo, hi) == (1, 2)
    ray_serve.start_ray(None)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(ray_serve.build_app(model, drafting, srv, ray_settings, lo, hi), name="specdec", route_prefix="/",
                  blocking=False)
        base = f"http://127.0.0.1:{port}"
        assert wait_for_replicas(1, 240)

        def one(i):
            body = {"model": MODEL, "prompt": f"Count from 1 to {40 + i}:", "max_tokens": 96, "temperature": 0}
            return httpx.post(base + "/v1/completions", json=body, timeout=300).status_code

        grew = False
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(one, i) for i in range(48)]
            deadline = time.time() + 240
            while not all(f.done() for f in futures) and time.time() < deadline:
                grew = grew or replicas_running() == 2
                time.sleep(0.5)
            statuses = [f.result() for f in futures]
        assert statuses == [200] * 48
        assert grew, "the deployment never ran a second replica under 8 concurrent clients"
        assert wait_for_replicas(1, 120), "the deployment did not shrink back to one replica once idle"
        assert httpx.post(base + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2},
                          timeout=120).status_code == 200
    finally:
        serve.shutdown()
        ray.shutdown()
