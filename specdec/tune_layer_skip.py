"""`specdec tune-layer-skip`: run greedy generation for a few L on a few prompts and keep the L with
the best measured tokens/s (`tune_layer_skip`); the CLI saves it with the drafter's `save_choice`
(specdec.drafters.layer_skip), in the file that `--layer-skip auto` reads.
"""

from __future__ import annotations

from specdec.config import GenerationConfig, SamplingParams
from specdec.drafters.base import NoDrafter
from specdec.drafters.layer_skip import LayerSpec, make_layer_skip, resolve_layers
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from specdec.model.transformer import Transformer


def default_candidates(n_layers: int) -> list[int]:
    """A handful of L spread over 1..n_layers-1 (eighths of the depth), plus n_layers-1: a model not
    trained for early exit (most are) drafts acceptably only from its last layers."""
    if n_layers < 2:
        raise SpecdecError(f"layer skip needs a model with at least 2 layers; this one has {n_layers}")
    return sorted({min(max(round(n_layers * f / 8), 1), n_layers - 1) for f in range(1, 8)} | {n_layers - 1})


def _run_prompts(target: Transformer, layers: LayerSpec | None, prompts: list[list[int]], cfg: GenerationConfig,
                 capacity: int, share: bool) -> dict:
    """Greedy runs over prompts with layer skip `layers` (None: plain decoding); totals and outputs."""
    cache = target.new_cache(capacity)
    drafter = NoDrafter() if layers is None else make_layer_skip(target, layers, capacity, cache if share else None)
    engine = Engine.single(target, drafter, capacity, cache=cache)
    tokens = steps = drafted = accepted = emitted = 0
    seconds = 0.0
    outputs = []
    for prompt in prompts:
        result = engine.generate(prompt, cfg)
        s = result.stats
        outputs.append(result.tokens)
        tokens += s.new_tokens
        seconds += s.seconds
        steps += s.steps
        drafted += s.drafted
        accepted += s.accepted
        emitted += sum(s.emitted_per_step)
    return {"new_tokens": tokens, "seconds": round(seconds, 4),
            "tokens_per_second": round(tokens / seconds, 3) if seconds > 0 else 0.0,
            "alpha": round(accepted / drafted, 4) if drafted else 0.0,
            "tau": round(emitted / steps, 4) if steps else 0.0, "outputs": outputs}


def tune_layer_skip(target: Transformer, prompts: list[list[int]], candidates: list[LayerSpec] | None = None,
                    max_new_tokens: int = 32, k: int = 4, share: bool = True, progress=None) -> dict:
    """Greedy generation on `prompts` with each candidate L (or subset); the best by tokens/s (ties:
    higher tau). Returns {"best": L, "beats_plain": bool, "results": [{"layers", "alpha", "tau",
    "tokens_per_second", "speedup", ...}], "plain_tokens_per_second", "n_layers", "k", "max_new_tokens"}.
    "beats_plain" is False when even the best L is slower than plain decoding (usual for models not
    trained for early exit: their shallow exits are rarely accepted).

    "matches_plain" per result: the greedy output equals plain decoding's (always in fp32; in bf16 a
    near-tie may round differently in a many-token verify pass than in a one-token step)."""
    n = target.config.num_layers
    if not prompts or not all(prompts):
        raise SpecdecError("tune-layer-skip needs at least one non-empty prompt")
    candidates = default_candidates(n) if candidates is None else list(candidates)
    if not candidates:
        raise SpecdecError("tune-layer-skip needs at least one candidate L")
    for c in candidates:
        resolve_layers(n, c)  # a clear error before any timing
    capacity = max(len(p) for p in prompts) + max_new_tokens + k + 1
    cfg = GenerationConfig(max_new_tokens, k, SamplingParams())
    # warm-up (first-call overheads), then plain decoding as the reference for speed and output
    _run_prompts(target, candidates[0], prompts[:1], GenerationConfig(min(4, max_new_tokens), k), capacity, share)
    plain = _run_prompts(target, None, prompts, cfg, capacity, share)
    results = []
    for c in candidates:
        spec = c if isinstance(c, int) else list(c)
        if isinstance(c, list) and c == list(range(len(c))):
            spec = len(c)  # a prefix is L
        r = _run_prompts(target, spec, prompts, cfg, capacity, share)
        same = r.pop("outputs") == plain["outputs"]  # in low precision, near-ties may round either way
        speedup = r["tokens_per_second"] / plain["tokens_per_second"] if plain["tokens_per_second"] else 0.0
        r = {"layers": spec, **r, "speedup": round(speedup, 3), "matches_plain": same}
        results.append(r)
        if progress:
            progress(f"layer skip {spec}: {r['tokens_per_second']:.2f} tok/s (x{r['speedup']:.2f}), "
                     f"tau {r['tau']:.2f}, alpha {r['alpha']:.2f}")
    best = max(results, key=lambda r: (r["tokens_per_second"], r["tau"]))
    return {"best": best["layers"], "beats_plain": best["tokens_per_second"] > plain["tokens_per_second"],
            "results": results, "plain_tokens_per_second": plain["tokens_per_second"],
            "n_layers": n, "k": k, "max_new_tokens": max_new_tokens}
