"""`specdec serve`: an OpenAI-compatible HTTP server over the speculative engine.

Modules: protocol (request/response bodies), stepper (slots and one step at a time), scheduler
(the engine's thread, admission, cancellation, timeouts, stop strings), metrics (Prometheus),
memory (the start-up budget check), app (FastAPI endpoints and the graceful-shutdown server).
"""

from __future__ import annotations

import sys

from specdec.settings import DraftingSettings, ModelSettings, RaySettings, ServeSettings


def build_scheduler(model: ModelSettings, drafting: DraftingSettings, srv: ServeSettings = ServeSettings(),
                    progress=None):
    """The engine's parts (engine.build), one drafter per slot, policy, memory check, stepper and scheduler."""
    from specdec.engine.build import Engine, log
    from specdec.model.loading import resolve_device
    from specdec.policy import AdaptivePolicy, PolicyConfig
    from specdec.server.memory import GIB, available_bytes, default_budget, plan_memory
    from specdec.server.metrics import ServerMetrics
    from specdec.server.scheduler import Scheduler, k_schedule
    from specdec.server.stepper import StepwiseGenerator

    progress = progress or log
    schedule = srv.schedule()
    k, capacity = drafting.k, model.max_context

    available = available_bytes(resolve_device(model.device))  # before the models take their share
    # the target and what the drafter needs; the slots' target caches are the stepper's rows
    built = Engine.from_settings(model, drafting, progress, share_cache=False)
    target, draft = built.target, built.parts.draft

    def drafter_factory(note=None):  # one per slot: only the probe below logs how it drafts
        return built.drafter(note)

    probe = drafter_factory(progress)  # validates the drafting values before anything large is allocated
    budget = int(srv.memory_budget_gb * GIB) if srv.memory_budget_gb is not None else default_budget(available)
    plan = plan_memory(target.module, draft.module if draft else None, capacity, srv.max_batch,
                       max(srv.prefill_chunk, k + 1 + probe.caps.tree_nodes), budget,
                       drafter_bytes_per_slot=built.method.entry.slot_bytes(built.options))
    plan.check()
    progress(f"memory: {plan.total / GIB:.3f} GiB of a {budget / GIB:.3f} GiB budget "
             f"({srv.max_batch} slots x {plan.kv_per_slot / GIB:.3f} GiB KV)")
    policy_factory = None
    if drafting.adaptive:  # the server's steps pick k only (no confidence rule)
        base = built.policy(probe, k, drafting.cost_profile, max_rows=srv.max_batch * (k + 1))
        if base is not None:
            def policy_factory():
                return AdaptivePolicy(base.costs, PolicyConfig(k_max=k))
    del probe
    stepper = StepwiseGenerator(target.module, drafter_factory, capacity, srv.max_batch,
                                policy_factory, srv.prefill_chunk, prefix_cache=srv.prefix_cache)
    limit = k_schedule(srv.spec_off_batch, schedule) if (schedule or srv.spec_off_batch is not None) else None
    return Scheduler(stepper, target.tokenizer, target.eos_ids, k=k, max_queue=srv.max_queue,
                     request_timeout=srv.request_timeout or None, k_for_batch=limit, metrics=ServerMetrics(),
                     memory=plan, model=target)


def serve(model: ModelSettings, drafting: DraftingSettings, srv: ServeSettings = ServeSettings(),
          ray: RaySettings = RaySettings()) -> int:
    """Build everything, then serve until SIGTERM/SIGINT (graceful: see app.Server). Beyond loopback
    with no API key, a one-line warning first."""
    from specdec.server.guard import exposure_warning
    warning = exposure_warning(srv.host, srv.access())
    if warning:
        print(warning, file=sys.stderr)
    if ray.ray:
        from specdec.server.ray_serve import serve_ray
        return serve_ray(model, drafting, srv, ray)
    from specdec.server.app import create_app, make_server
    scheduler = build_scheduler(model, drafting, srv)
    app = create_app(scheduler, srv.served_model_name or model.model, srv.access(), srv.limits())
    server = make_server(app, scheduler, srv.host, srv.port, srv.shutdown_grace)
    server.run()
    return 0
