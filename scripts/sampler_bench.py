"""One draw from a 151,936-entry distribution (Qwen2.5's vocabulary) on this CPU: torch.multinomial, the
exponential race (argmax of p / Exp(1) noise, what the verifiers used before), our sampler
(sampling/logits.sample), a float64 cumsum into a fresh tensor against a kept one, and a plain step's
rejection_accept with k = 0. Medians of 5 rounds of 100 calls, ms.

Usage: python scripts/sampler_bench.py > runs/sampler.txt
"""

import statistics
import time

import torch

from specdec.sampling.logits import sample
from specdec.sampling.rejection import rejection_accept


def ms(fn, calls=100, rounds=5):
    fn()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        ts.append((time.perf_counter() - t0) / calls * 1e3)
    return statistics.median(ts)


def main() -> None:
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(1, 151936, generator=g) * 3 / 0.7, dim=-1)  # [1, vocab]
    kept = torch.empty(151936, dtype=torch.float64)
    empty = torch.empty(0, dtype=torch.long)
    rows = {
        "torch.multinomial": lambda: torch.multinomial(p, 1, generator=g),
        "exponential race": lambda: (p / torch.empty_like(p).exponential_(generator=g)).argmax(dim=-1),
        "sampling.logits.sample": lambda: sample(p, g),
        "float64 cumsum, fresh tensor": lambda: torch.cumsum(p[0], 0, dtype=torch.float64),
        "float64 cumsum, kept tensor": lambda: torch.cumsum(p[0], 0, dtype=torch.float64, out=kept),
        "rejection_accept, k = 0": lambda: rejection_accept(empty, p, None, g),
    }
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, vocabulary {p.shape[-1]}")
    for name, fn in rows.items():
        print(f"{name:30s} {ms(fn):.3f} ms")


if __name__ == "__main__":
    main()
