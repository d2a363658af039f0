"""Plain decoding, one request at a time: bench's engine, the server's engine stepped directly, and the server
over HTTP in process (streamed), interleaved prompt by prompt; wall seconds each."""
import json, socket, sys, threading, time
import httpx
from specdec.engine.build import Builder, EnginePlan
from specdec.server import build_scheduler
from specdec.server.app import create_app, make_server
from specdec.settings import ModelSettings, DraftingSettings, ServeSettings
from specdec.config import GenerationConfig
from specdec.bench.datasets import load_prompts
from specdec.model.tokenizer import encode_messages
model = ModelSettings(model="qwen2.5-coder-1.5b-instruct")
drafting = DraftingSettings(draft="none")
sched = build_scheduler(model, drafting, ServeSettings(max_batch=16), progress=lambda s: None)
direct = build_scheduler(model, drafting, ServeSettings(max_batch=16), progress=lambda s: None)  # never started
b, m = Builder.from_settings(model, drafting, progress=lambda s: None, share_cache=False)
eng = b.engine(m, EnginePlan.of(drafting, max_batch=1))
app = create_app(sched, "m")
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]
server = make_server(app, sched, "127.0.0.1", port, log_level="warning")
th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True); th.start()
while not server.started: time.sleep(0.05)
base = f"http://127.0.0.1:{port}"
N = int(sys.argv[1]) if len(sys.argv) > 1 else 96
texts = [p.turns[0] for p in load_prompts()][:8]
cfg = GenerationConfig(N, 4)
def http(text):
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": N, "temperature": 0, "stream": True}
    n = 0
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            n += 1
    return n
secs = {"bench_engine": 0.0, "server_engine": 0.0, "http": 0.0}
toks = {k: 0 for k in secs}
for i, text in enumerate(texts):
    ids = encode_messages(b.target.tokenizer, [{"role": "user", "content": text}])
    order = ["bench_engine", "server_engine", "http"]
    order = order[i % 3:] + order[:i % 3]
    for name in order:
        t = time.perf_counter()
        if name == "http":
            http(text); n = N
        else:
            e = eng if name == "bench_engine" else direct.engine
            n = len(e.generate(ids, cfg, b.target.eos_ids).tokens)
        secs[name] += time.perf_counter() - t; toks[name] += n
print(json.dumps({k: round(toks[k] / secs[k], 2) for k in secs} | {"seconds": secs}))
server.should_exit = True
