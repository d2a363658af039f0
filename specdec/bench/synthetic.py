"""Speed where the real files cannot go: random weights in a real model's shapes, and an oracle drafter
at a stated acceptance.

A GPU machine here receives at most 64 MiB, so the GGUFs stay behind. Speed does not depend on the
weights' values; acceptance does. `successor_model` builds a model whose greedy next token is a fixed
permutation of the current one (`succ[t]`) by a margin far wider than bf16's rounding: the lm_head is the
embedding permuted, and the layers write little into the residual stream. Any verify path (one row,
k + 1 rows, a CUDA graph) then agrees with plain decoding, and `OracleDrafter` proposes the successor
chain with each token kept with probability alpha, so the measured acceptance is the stated one, in bf16
as in fp32. Random weights without that structure break near-ties at once (bf16 acceptance 0.002).

`measure` is scripts/cuda_bench.py's whole run for one mode (eager, CUDA graphs, the Triton layer loop):
the profile (roofline, v(n), the draft's c and an EAGLE head's; each one's c as a k-token chain pays it,
drafted token by token or on the device; the head's EAGLE-2 tree, host levels against device ones; a
server's rows drafting together, d(B)), plain decoding's rate, and the oracle's rate, acceptance and
predicted speedup at each alpha. A CPU test runs it on tiny shapes, so the GPU bench cannot rot
between GPU sessions.
"""

from __future__ import annotations

import math
import random
import statistics
import time

import torch

from specdec.bench.profile import POOL_ROWS, interleaved_seconds, profile, synchronize
from specdec.config import GenerationConfig, SamplingParams, TreeConfig
from specdec.drafters.base import BaseDrafter, Capabilities, DraftState, NoDrafter
from specdec.drafters.device_chain import DeviceChains
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.heads.modules import build_head, eagle_config
from specdec.engine.engine import Engine
from specdec.model.transformer import ModelConfig, Static, Transformer
from specdec.policy.costs import interpolate
from specdec.policy.measure import ragged_fn
from specdec.tree import DraftTree

SHAPES = {  # from the GGUFs' metadata (specdec/model/loading.py reads the same fields)
    "qwen2.5-coder-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                               num_heads=12, num_kv_heads=2, head_dim=128),
    "qwen2.5-coder-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                               num_heads=14, num_kv_heads=2, head_dim=64),
    # CPU tests: the same structure, tiny
    "tiny-target": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=16),
    "tiny-draft": dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=1,
                       num_heads=2, num_kv_heads=1, head_dim=16),
}
TREE = TreeConfig(16, 4, 4)  # the head's tree timed: budget 16, the flags' default depth 4 and topk 4
RESIDUAL_WRITE = 0.01  # o_proj's and down_proj's scale against the embedding's: the residual stays near e_t


def successor_model(shape: str, device: str, dtype: torch.dtype, seed: int) -> tuple[Transformer, torch.Tensor]:
    """(a Transformer in SHAPES[shape], succ # [vocab]): its greedy next token after t is succ[t]."""
    cfg = ModelConfig(**SHAPES[shape], rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=4096,
                      tie_word_embeddings=False, attention_bias=True)
    with torch.device(device):
        model = Transformer(cfg)
    model.to(device)  # the RoPE tables are made on the CPU
    gen = torch.Generator(device).manual_seed(seed)
    succ = torch.randperm(cfg.vocab_size, generator=gen, device=device)  # [vocab]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms' weights 1, biases 0
                p.fill_(1.0 if name.endswith("norm.weight") else 0.0)
                continue
            scale = RESIDUAL_WRITE if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
            p.normal_(0.0, scale / math.sqrt(p.shape[1]), generator=gen)
        embed = model.model.embed_tokens.weight  # [vocab, hidden], rows of norm about sqrt(hidden)
        embed.normal_(0.0, 1.0, generator=gen)
        # logit_j = h . embed[pred(j)], h about embed[t] normalized: largest at j = succ[t], by about
        # hidden against the others' 4-5 sqrt(hidden)
        model.lm_head.weight.copy_(embed[torch.argsort(succ)])
    return model.to(dtype).eval(), succ


def random_eagle(target: Transformer, capacity: int, seed: int) -> EagleDrafter:
    """An EAGLE drafter with a random head in the shipped head's shape (one layer of the target's, its MLP
    2048 wide where the target's is wider, a 32,768-id draft vocabulary): its cost, not its acceptance."""
    cfg = target.config
    torch.manual_seed(seed)
    head = build_head(eagle_config(cfg, min(32768, cfg.vocab_size), min(2048, cfg.intermediate_size)))
    return EagleDrafter(target, head.to(target.device, target.dtype), capacity)


def follows(successor: torch.Tensor, prompt: list[int], tokens: list[int]) -> bool:
    """Whether tokens continue the prompt along the successor chain (successor_model's greedy path)."""
    succ = successor.tolist()
    return all(succ[a] == b for a, b in zip([prompt[-1]] + tokens[:-1], tokens))


class OracleDrafter(BaseDrafter):
    """Proposes the successor chain of the last committed token, each token kept with probability alpha,
    else replaced by another id: the target accepts each token with probability alpha (the chain ends at
    the first replaced one), at no draft cost."""

    caps = Capabilities()

    def __init__(self, successor: torch.Tensor, alpha: float, seed: int = 0):
        self.successor = successor.tolist()  # [vocab]
        self.alpha, self.vocab = alpha, len(self.successor)
        self.rng = random.Random(seed)

    def start(self, prompt: list[int]) -> None:
        pass

    def propose(self, state: DraftState) -> DraftTree:
        out, t = [], state.tokens[-1]
        for _ in range(state.k):
            t = self.successor[t]
            kept = t if self.rng.random() < self.alpha else (t + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
            out.append(kept)
        return DraftTree.chain(torch.tensor(out, dtype=torch.long))


def timed(generate, device, n: int):
    """(seconds, result) of generate(n), the device synchronized around it."""
    synchronize(device)
    t0 = time.perf_counter()
    result = generate(n)
    synchronize(device)
    return time.perf_counter() - t0, result


def rate(generate, device, new_tokens: int, repeats: int):
    """(tokens/s after the prefill, the last run's result) of generate(n tokens): (n - 1) / (time(n) -
    time(1)), medians of repeats."""
    one = statistics.median(timed(generate, device, 1)[0] for _ in range(repeats))
    runs = [timed(generate, device, new_tokens) for _ in range(repeats)]
    full = statistics.median(s for s, _ in runs)
    return (new_tokens - 1) / max(full - one, 1e-9), runs[-1][1]


def decode_rate(engine: Engine, prompt: list[int], new_tokens: int, k: int = 1, repeats: int = 3):
    """rate() of the engine's greedy generation at draft length k: (tokens/s, GenerationResult)."""
    return rate(lambda n: engine.generate(prompt, GenerationConfig(n, k, stop_at_eos=False)), engine.cache.k.device,
                new_tokens, repeats)


def oracle_run(target: Transformer, successor: torch.Tensor, prompt: list[int], plain, plain_rate: float,
               alpha: float, k: int, verify_cost: dict, repeats: int) -> dict:
    """The oracle at `alpha` against plain decoding (rate and result given): measured acceptance beside the
    stated one, and the speedup predicted from it and v(k+1) beside the measured one."""
    drafter = OracleDrafter(successor, alpha)
    engine = Engine.single(target, drafter, len(prompt) + len(plain.tokens) + 2 * k + 8)
    rate, res = decode_rate(engine, prompt, len(plain.tokens), k, repeats)
    s = res.stats
    measured = s.accepted / (s.accepted + s.rejections) if s.accepted + s.rejections else 0.0  # iid alpha
    tokens = k + 1 if measured >= 1.0 else (1 - measured ** (k + 1)) / (1 - measured)
    v = interpolate({int(n): c for n, c in verify_cost.items()}, k + 1)
    return {"alpha_stated": alpha, "alpha_measured": round(measured, 3), "tau": round(s.tau, 3),
            "tokens_per_second": round(rate, 2), "speedup": round(rate / plain_rate, 3),
            "predicted_speedup": round(tokens / v, 3), "same_tokens_as_plain": res.tokens == plain.tokens}


def chain_costs(draft: Transformer, head: EagleDrafter, prompt: list[int], k: int, step_seconds: float,
                repeats: int) -> dict:
    """A greedy k-token chain of the draft model and of the EAGLE head, drafted token by token (the host
    reads each token) and on the device (device_chain.py: one sync, one CUDA graph under graphs), per draft
    token over the target's plain step: c as a chain pays it (the head's with one entry of true features
    fed first, as after a verify); and the head's EAGLE-2 tree (TREE), host levels against device ones,
    a whole tree over the plain step."""
    state = DraftState(prompt, k, SamplingParams(), None)
    tree_state = DraftState(prompt, TREE.depth, SamplingParams(), None)
    runs, per = {}, {}  # per: what a run's time is divided by (a chain's tokens; 1: a whole tree)
    for on_device in (False, True):
        where = "device" if on_device else "host"
        if draft is not None:
            drafter = DraftModelDrafter(draft, draft.config.vocab_size, len(prompt) + k + 8, on_device=on_device)
            drafter.start(prompt)
            runs[f"chain_cost_ratio_{where}"] = lambda d=drafter: d.propose(state).tokens.tolist()
            per[f"chain_cost_ratio_{where}"] = k
        for tree in (None, TREE):
            h = EagleDrafter(head.target, head.prepared, head.capacity, tree=tree, on_device=on_device)
            h.start(prompt)
            h.feed(0, torch.zeros(len(prompt), head.features.shape[1], device=head.features.device))
            name = f"head_{'chain' if tree is None else 'tree'}_cost_ratio_{where}"
            runs[name] = lambda d=h, st=state if tree is None else tree_state: d.propose(st).tokens.tolist()
            per[name] = k if tree is None else 1
    times = interleaved_seconds(runs, head.features.device, repeats)
    return {key: round(statistics.median(ts) / per[key] / step_seconds, 3) for key, ts in times.items()}


def pooled_draft_costs(draft: Transformer, context: int, k: int, step_seconds: float, repeats: int) -> dict:
    """A server's rows drafting together with the draft model, B of POOL_ROWS rows at `context` cached slots:
    a greedy k-token chain of all B rows (device_chain.py's draft_rows: one CUDA graph under graphs) and one
    ragged draft forward of B rows, one token each (what the policy's d(n) times at a server's start,
    policy/measure.py). Each is reported against one row's (d(B)), and the chain per row and token over the
    target's plain step (c per row: c d(B) / B)."""
    vocab = draft.config.vocab_size
    cache = draft.new_cache(context + k + 2, batch=max(POOL_ROWS))
    chains = DeviceChains(draft.graphs is not None)
    runs = {}
    for b in POOL_ROWS:
        rows = list(range(b))
        runs[f"chain_{b}"] = lambda rows=rows: chains.draft_rows(
            draft, cache, rows, [[1]] * len(rows), [context] * len(rows), k, (SamplingParams(),) * len(rows), None,
            vocab, False).tokens.tolist()
        runs[f"forward_{b}"] = ragged_fn(draft, b, context, cache)
    med = {key: statistics.median(ts) for key, ts in interleaved_seconds(runs, draft.device, repeats).items()}
    return {"rows": list(POOL_ROWS),
            "chain_d": {b: round(med[f"chain_{b}"] / med["chain_1"], 3) for b in POOL_ROWS},
            "forward_d": {b: round(med[f"forward_{b}"] / med["forward_1"], 3) for b in POOL_ROWS},
            "chain_cost_ratio_per_row": {b: round(med[f"chain_{b}"] / (b * k * step_seconds), 3) for b in POOL_ROWS}}


def compiled_step(model: Transformer, context: int, repeats: int, mode: str) -> dict:
    """The plain step (one token after `context` cached) through torch.compile (Inductor's fusions; with
    mode "reduce-overhead" in torch's own CUDA graph): compile seconds and the step's best seconds."""
    cache = model.new_cache(context + 1)  # outside inference mode: Inductor mutates the cache in place
    slots = torch.tensor([context], device=model.device)  # [1]
    mask = torch.arange(cache.capacity, device=model.device)[None, :] <= slots[:, None]  # [1, capacity]
    x = torch.tensor([[1]], device=model.device)  # [1, 1]
    step = torch.compile(lambda t: model.layers_forward(t, cache, Static(slots), slots[None], mask, True),
                         fullgraph=True, dynamic=False, mode=mode)
    with torch.no_grad():
        t0 = time.perf_counter()
        for _ in range(3):  # compile, then reduce-overhead's recording runs
            step(x)
        synchronize(model.device)
        compile_seconds = time.perf_counter() - t0
        seconds = min(interleaved_seconds({"step": lambda: step(x)}, model.device, repeats)["step"])
    return {"mode": mode, "compile_seconds": round(compile_seconds, 1), "step_seconds": round(seconds, 5)}


def hf_model(model: Transformer):
    """HF transformers' Qwen2 class holding the same weights (the same device and dtype)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    c = model.config
    cfg = Qwen2Config(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                      num_key_value_heads=c.num_kv_heads, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
                      max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=False)
    with torch.device(model.device):
        hf = Qwen2ForCausalLM(cfg).to(model.dtype)
    hf.load_state_dict(model.state_dict(), strict=True, assign=True)  # the same tensors, not copies
    return hf.eval()


def hf_decode_rate(model: Transformer, prompt: list[int], new_tokens: int, repeats: int) -> dict:
    """HF transformers' greedy generate() on the same weights: tokens/s after the prefill, as decode_rate
    times ours, and whether its tokens are the successor chain."""
    hf = hf_model(model)
    ids = torch.tensor([prompt], device=model.device)
    tokens_per_second, out = rate(lambda n: hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False),
                                  model.device, new_tokens, repeats)
    return {"tokens_per_second": round(tokens_per_second, 2), "tokens": out[0, len(prompt):].tolist()}


def hf_static_compiled_rate(model: Transformer, prompt: list[int], new_tokens: int, repeats: int) -> dict:
    """HF transformers' generate() with its static cache, which compiles the forward (torch.compile, its
    default mode; on a CPU only when asked, as here): the first call's seconds (the compile) and tokens/s
    after the prefill, as hf_decode_rate times, and whether its tokens are ours."""
    from transformers import CompileConfig
    hf = hf_model(model)
    ids = torch.tensor([prompt], device=model.device)
    config = CompileConfig()
    config._compile_all_devices = True  # transformers compiles on accelerators only, unless asked

    def generate(n):
        return hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, cache_implementation="static",
                           compile_config=config)
    first, _ = timed(generate, model.device, 2)
    tokens_per_second, out = rate(generate, model.device, new_tokens, repeats)
    return {"compile_seconds": round(first, 1), "tokens_per_second": round(tokens_per_second, 2),
            "tokens": out[0, len(prompt):].tolist()}


def measure(target: Transformer, successor: torch.Tensor, draft: Transformer | None, prompt: list[int],
            new_tokens: int, alphas, k: int, repeats: int = 3, profile_repeats: int = 15,
            bandwidth_mb: int = 2048) -> dict:
    """One mode's numbers: the profile, plain decoding's rate, and the oracle at each alpha (successor:
    successor_model's)."""
    t0 = time.perf_counter()
    head = random_eagle(target, len(prompt) + 32, 2)  # room for a tree's scratch entries
    prof = profile(target, draft, context=len(prompt), repeats=profile_repeats, bandwidth_mb=bandwidth_mb,
                   head=head.entry(len(prompt)))
    prof["profile_seconds"] = round(time.perf_counter() - t0, 1)
    prof.update(chain_costs(draft, head, prompt, k, prof["step_seconds"], profile_repeats))
    plain_rate, plain = decode_rate(Engine.single(target, NoDrafter(), len(prompt) + new_tokens + 8), prompt,
                                    new_tokens, 1, repeats)
    prof["plain_decode_tokens_per_second"] = round(plain_rate, 2)
    prof["plain_follows_successor"] = follows(successor, prompt, plain.tokens)
    prof[f"oracle_k{k}"] = {str(a): oracle_run(target, successor, prompt, plain, plain_rate, a, k,
                                               prof["verify_cost"], repeats) for a in alphas}
    if draft is not None:  # last, and on its own: a GPU run keeps the numbers above whatever happens here
        try:
            prof["pooled_draft"] = pooled_draft_costs(draft, len(prompt), k, prof["step_seconds"], profile_repeats)
        except Exception as e:  # noqa: BLE001 - reported in the JSON, beside the rest
            prof["pooled_draft"] = {"error": f"{type(e).__name__}: {e}"}
    return prof
