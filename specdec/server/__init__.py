"""`specdec serve`: an OpenAI-compatible HTTP server over the speculative engine.

Modules: protocol (request/response bodies), stepper (slots and one step at a time), scheduler
(the engine's thread, admission, cancellation, timeouts, stop strings), metrics (Prometheus),
memory (the start-up budget check), app (FastAPI endpoints and the graceful-shutdown server).
"""

from __future__ import annotations

import argparse

from specdec.errors import SpecdecError

DEFAULT_GRACE_SECONDS = 10.0
SUFFIX_BYTES_PER_TOKEN = 512  # a mutable suffix automaton, per indexed token (specdec/drafters/suffix.py)


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    """The serve-only flags (add_model_flags and add_spec_flags give the model and drafting ones)."""
    from specdec.flags import integer
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=integer, default=8000, help="port to listen on")
    p.add_argument("--max-batch", type=integer, default=4,
                   help="sequences generated at once (slots, each with its own KV cache of --max-context tokens)")
    p.add_argument("--max-queue", type=integer, default=64,
                   help="requests that may wait for a slot; beyond that the answer is 429 with Retry-After")
    p.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds a request may take, queueing included (finish_reason 'timeout'; 0 = none)")
    p.add_argument("--memory-budget-gb", type=float, default=None,
                   help="weights + KV caches + head-room must fit this (default: available memory at start "
                        "minus max(0.5 GiB, 10%%))")
    p.add_argument("--spec-off-batch", type=integer, default=None,
                   help="plain steps (no drafting) while more than N sequences are active")
    p.add_argument("--k-schedule", default=None,
                   help="draft length by active batch size, e.g. 1:4,4:2,8:0 (from 4 sequences k<=2, from 8 plain)")
    p.add_argument("--prefill-chunk", type=integer, default=256,
                   help="prompt tokens prefilled per step, so long prompts do not stall running sequences")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="prefill every prompt whole (default: a request reuses the keys/values a free slot holds of "
                        "its prompt's beginning, such as a conversation's earlier turns)")
    p.add_argument("--shutdown-grace", type=float, default=DEFAULT_GRACE_SECONDS,
                   help="on SIGTERM, seconds in-flight requests may still run before they end with 'abort'")
    p.add_argument("--served-model-name", default=None, help="the model id clients use (default: --model)")
    ray = p.add_argument_group("replicas on Ray Serve (pip install -e '.[ray]')")
    ray.add_argument("--ray", action="store_true",
                     help="serve the same API from specdec replicas under Ray Serve, each a whole engine; a "
                          "conversation's turns go to the replica that served it while it has a free slot")
    ray.add_argument("--replicas", type=integer, default=None, help="--ray: replicas (default 2)")
    ray.add_argument("--autoscale", default=None, metavar="MIN:MAX", help="--ray: replicas scaled by load between MIN and MAX")
    ray.add_argument("--ray-address", default=None,
                     help="--ray: join this Ray cluster (default: start a local one bound to loopback)")
    ray.add_argument("--cpus-per-replica", type=float, default=1.0, help="--ray: CPUs Ray reserves for each replica")
    ray.add_argument("--ray-routing", choices=("conversation", "least-loaded"), default="conversation",
                     help="--ray: a conversation's turns to the replica that served it while it has a free slot "
                          "(default), or Ray Serve's own least-loaded choice for every request")


def drafting_method(args) -> str:
    """The runner's choice of drafter; serve has no layer-skip yet."""
    from specdec.runner import drafting_method as chosen
    method = chosen(args)
    if method == "layer-skip":
        raise SpecdecError("specdec serve does not support --layer-skip yet; use it with `specdec generate`")
    return method


def build_scheduler(args, progress=None):
    """Models, drafters (one per slot), policy, memory check, stepper and scheduler from CLI values."""
    from specdec.config import NgramConfig, SuffixConfig
    from specdec.model import load_model, model_flags
    from specdec.model.loading import resolve_device
    from specdec.policy import AdaptivePolicy, PolicyConfig, parse_schedule
    from specdec.runner import (build_drafter, build_policy, check_draft_flags, load_head_for, log, lookahead_config,
                                tree_config)
    from specdec.server.memory import GIB, available_bytes, default_budget, plan_memory
    from specdec.server.metrics import ServerMetrics
    from specdec.server.scheduler import Scheduler, k_schedule
    from specdec.server.stepper import StepwiseGenerator

    progress = progress or log
    for flag, value, low in (("--max-context", args.max_context, 1), ("--max-batch", args.max_batch, 1),
                             ("--max-queue", args.max_queue, 0), ("--prefill-chunk", args.prefill_chunk, 1),
                             ("--k", args.k, 1)):
        if value < low:
            raise SpecdecError(f"{flag} must be >= {low}, got {value}")
    if args.spec_off_batch is not None and args.spec_off_batch < 0:
        raise SpecdecError(f"--spec-off-batch must be >= 0, got {args.spec_off_batch}")
    if args.request_timeout < 0:
        raise SpecdecError(f"--request-timeout must be >= 0 (0 = none), got {args.request_timeout}")
    check_draft_flags(args)
    if args.memory_budget_gb is not None and args.memory_budget_gb <= 0:
        raise SpecdecError(f"--memory-budget-gb must be > 0, got {args.memory_budget_gb}")
    schedule = parse_schedule(args.k_schedule) if args.k_schedule else None
    method = drafting_method(args)
    tree = tree_config(args)
    if tree is not None and method not in ("draft", "head"):
        raise SpecdecError("draft trees (--tree-budget / --tree-choices) need a draft model (--draft MODEL) "
                           "or an EAGLE head (--head)")

    available = available_bytes(resolve_device(args.device))  # before the models take their share
    target = load_model(args.model, progress=progress, **model_flags(args))
    # the server drafts for many sequences in one draft forward (multi-row GEMMs), so the draft packs too
    draft = load_model(args.draft, progress=progress, draft=True, **model_flags(args)) if method in ("draft", "hybrid") else None
    ngram = NgramConfig(args.ngram_max, args.ngram_min)
    suffix = SuffixConfig(args.suffix_cache_tokens, args.suffix_min_match, args.datastore)

    head = load_head_for(args.head, target, args.model) if method == "head" else None

    def drafter_factory():
        return build_drafter(method, target, args.max_context, draft, ngram, args.draft_vocab, args.draft_p_min,
                             tree, suffix, lookahead_config(args), args.draft_window, head)

    probe = drafter_factory()  # validates the drafting values before anything large is allocated
    tree_nodes = probe.caps.tree_nodes
    budget = int(args.memory_budget_gb * GIB) if args.memory_budget_gb is not None else default_budget(available)
    plan = plan_memory(target.module, draft.module if draft else None, args.max_context, args.max_batch,
                       max(args.prefill_chunk, args.k + 1 + tree_nodes), budget,
                       drafter_bytes_per_slot=SUFFIX_BYTES_PER_TOKEN * args.suffix_cache_tokens if method == "suffix"
                       else 0)
    plan.check()
    progress(f"memory: {plan.total / GIB:.3f} GiB of a {budget / GIB:.3f} GiB budget "
             f"({args.max_batch} slots x {plan.kv_per_slot / GIB:.3f} GiB KV)")
    policy_factory = None
    if args.policy.startswith("adaptive"):  # the server's steps pick k only (no confidence rule)
        base = build_policy(probe, target, args.k, args.cost_profile, max_rows=args.max_batch * (args.k + 1))
        if base is not None:
            def policy_factory():
                return AdaptivePolicy(base.costs, PolicyConfig(k_max=args.k))
    del probe
    stepper = StepwiseGenerator(target.module, drafter_factory, args.max_context, args.max_batch,
                                policy_factory, args.prefill_chunk, prefix_cache=args.prefix_cache)
    limit = k_schedule(args.spec_off_batch, schedule) if (schedule or args.spec_off_batch is not None) else None
    return Scheduler(stepper, target.tokenizer, target.eos_ids, k=args.k, max_queue=args.max_queue,
                     request_timeout=args.request_timeout or None, k_for_batch=limit, metrics=ServerMetrics(),
                     memory=plan, model=target)


def serve(args) -> int:
    """Build everything, then serve until SIGTERM/SIGINT (graceful: see app.Server)."""
    if args.ray:
        from specdec.server.ray_serve import serve_ray
        return serve_ray(args)
    from specdec.server.app import create_app, make_server
    scheduler = build_scheduler(args)
    name = args.served_model_name or args.model
    app = create_app(scheduler, name)
    server = make_server(app, scheduler, args.host, args.port, args.shutdown_grace)
    server.run()
    return 0
