import cProfile, pstats, json, sys, time, torch
from pathlib import Path
from specdec.model import load_model
N = int(sys.argv[1])
Q = Path(__file__).resolve().parents[5] / "shared" / "data" / "spec_bench" / "question.jsonl"
lm = load_model("qwen2.5-coder-1.5b-instruct", progress=lambda *a: None)
text = "\n".join(t for line in Q.read_text().splitlines() for t in json.loads(line)["turns"])
ids = lm.tokenizer.encode(text)[:N]
def run():
    cache = lm.module.new_cache(N + 1)
    with torch.inference_mode():
        t0 = time.perf_counter(); lm.module(torch.tensor([ids]), cache, 0, last_only=True); return time.perf_counter() - t0
print("warm", run(), run())
pr = cProfile.Profile(); pr.enable(); t = run(); pr.disable()
print("profiled", t)
pstats.Stats(pr).sort_stats("tottime").print_stats(14)
