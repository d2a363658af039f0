"""The CUDA path measured: `specdec profile`'s numbers (bandwidth roofline, plain step, v(n), c) and
end-to-end decode speed, eager against CUDA graphs, in bf16.

The GGUFs cannot travel to the GPU machine here (the working tree it receives is capped at 64 MiB),
so the models are random weights in the exact Qwen2.5-Coder 1.5B and 0.5B shapes: speed does not
depend on the weights' values, acceptance does. End-to-end speculation therefore uses an oracle
drafter that proposes the target's own greedy continuation with each token kept with probability
alpha (else replaced), at zero draft cost: it measures the verify side at a known acceptance. The
draft model's cost enters through c, measured separately. Measured acceptance is reported as seen.

    PYTHONPATH=. python3 scripts/cuda_bench.py --out runs/cuda-bench.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from specdec.bench.profile import profile, synchronize
from specdec.config import GenerationConfig
from specdec.drafters.base import DraftState, NoDrafter
from specdec.model.cuda_graphs import enable_cuda_graphs
from specdec.engine.engine import Engine
from specdec.model.transformer import ModelConfig, Transformer
from specdec.tree import DraftTree

SHAPES = {  # from the GGUFs' metadata (specdec/model/loading.py reads the same fields)
    "qwen2.5-coder-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                               num_heads=12, num_kv_heads=2, head_dim=128),
    "qwen2.5-coder-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                               num_heads=14, num_kv_heads=2, head_dim=64),
}


def random_model(shape: str, device: str, dtype: torch.dtype, seed: int) -> Transformer:
    cfg = ModelConfig(**SHAPES[shape], rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=4096,
                      tie_word_embeddings=True, attention_bias=True)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():  # peaked next-token distributions, so greedy paths are stable
            p.normal_(0.0, 0.05 if p.dim() > 1 else 0.02).add_(1.0 if p.dim() == 1 else 0.0)
    model.tie_weights()
    return model.to(dtype).eval()


class OracleDrafter:
    """Proposes `reference` (the target's greedy continuation of `prompt`), each token kept with
    probability alpha, else replaced by another id: draft acceptance near alpha at no draft cost."""

    def __init__(self, prompt: list[int], reference: list[int], alpha: float, vocab: int, seed: int = 0):
        self.prompt, self.reference, self.alpha, self.vocab = prompt, reference, alpha, vocab
        self.rng = random.Random(seed)

    def start(self, prompt: list[int]) -> None:
        pass

    def propose(self, state: DraftState) -> DraftTree:
        at = len(state.tokens) - len(self.prompt)
        out = []
        for t in self.reference[at:at + state.k]:
            out.append(t if self.rng.random() < self.alpha else (t + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab)
        return DraftTree.chain(torch.tensor(out, dtype=torch.long))

    def observe(self, num_accepted: int) -> None:
        pass


def timed_generate(engine, prompt, new_tokens, k=1):
    device = engine.cache.k.device
    synchronize(device)
    t0 = time.perf_counter()
    result = engine.generate(prompt, GenerationConfig(new_tokens, k, stop_at_eos=False))
    synchronize(device)
    return time.perf_counter() - t0, result


def decode_rate(engine, prompt, new_tokens, k=1, repeats=3):
    """Tokens/s after the prefill: (n - 1) / (time(n tokens) - time(1 token)), medians of repeats."""
    one = statistics.median(timed_generate(engine, prompt, 1)[0] for _ in range(repeats))
    runs = [timed_generate(engine, prompt, new_tokens, k) for _ in range(repeats)]
    full = statistics.median(s for s, _ in runs)
    return (new_tokens - 1) / (full - one), runs[-1][1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=129)
    ap.add_argument("--alphas", default="0.6,0.8,0.95")
    ap.add_argument("--k", type=int, default=4)
    args = ap.parse_args()
    dtype = torch.bfloat16
    report = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
              "torch": torch.__version__, "dtype": str(dtype), "context": args.context, "modes": {}}
    vocab = SHAPES["qwen2.5-coder-1.5b"]["vocab_size"]
    prompt = [int(t) for t in torch.randint(0, vocab, (args.context,), generator=torch.Generator().manual_seed(0))]
    for mode in ("eager", "graphs"):
        target = random_model("qwen2.5-coder-1.5b", args.device, dtype, 0)
        draft = random_model("qwen2.5-coder-0.5b", args.device, dtype, 1)
        if mode == "graphs":
            enable_cuda_graphs(target)
            enable_cuda_graphs(draft)
        t0 = time.perf_counter()
        prof = profile(target, draft, context=args.context, repeats=15)
        prof["profile_seconds"] = round(time.perf_counter() - t0, 1)
        engine = Engine.single(target, NoDrafter(), args.context + args.new_tokens + 64)
        plain_rate, plain = decode_rate(engine, prompt, args.new_tokens)
        spec = {}
        for alpha in [float(a) for a in args.alphas.split(",")]:
            drafter = OracleDrafter(prompt, plain.tokens, alpha, target.config.vocab_size)
            eng = Engine.single(target, drafter, args.context + args.new_tokens + 64)
            rate, res = decode_rate(eng, prompt, args.new_tokens, args.k)
            spec[str(alpha)] = {"tokens_per_second": round(rate, 2), "speedup": round(rate / plain_rate, 3),
                                "measured_alpha": round(res.stats.alpha, 3), "tau": round(res.stats.tau, 3),
                                "same_tokens_as_plain": res.tokens == plain.tokens}
        prof.update({"plain_decode_tokens_per_second": round(plain_rate, 2), f"oracle_k{args.k}": spec})
        if target.graphs is not None:
            prof["graph_captures"] = target.graphs.captures
        report["modes"][mode] = prof
        print(mode, json.dumps({k: v for k, v in prof.items() if k != "roofline_rounds"}), flush=True)
        del target, draft, engine
        torch.cuda.empty_cache()
    e, g = report["modes"]["eager"], report["modes"]["graphs"]
    report["graphs_over_eager"] = {
        "plain_step": round(e["step_seconds"] / g["step_seconds"], 3),
        "plain_decode": round(g["plain_decode_tokens_per_second"] / e["plain_decode_tokens_per_second"], 3)}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report["graphs_over_eager"]))


if __name__ == "__main__":
    main()
