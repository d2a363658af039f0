"""`specdec serve`: an OpenAI-compatible HTTP server over the speculative engine.

Modules: protocol (request/response bodies), scheduler (the engine's thread: admission,
cancellation, timeouts, stop strings, streaming; the engine (specdec.engine) steps), metrics (Prometheus),
memory (the start-up budget check), app (FastAPI endpoints and the graceful-shutdown server).
"""

from __future__ import annotations

from specdec.engine.build import Builder, EnginePlan, log
from specdec.model.loading import resolve_device
from specdec.server.app import create_app, make_server
from specdec.server.memory import GIB, available_bytes, default_budget, plan_memory
from specdec.server.metrics import ServerMetrics
from specdec.server.scheduler import Scheduler, k_schedule
from specdec.settings import DraftingSettings, ModelSettings, ServeSettings


def build_scheduler(model: ModelSettings, drafting: DraftingSettings, srv: ServeSettings = ServeSettings(),
                    progress=None):
    """The engine (engine.build: its parts, one drafter and policy per slot) after the memory check, and
    the scheduler over it."""
    progress = progress or log
    schedule = srv.schedule()
    k, capacity = drafting.k, model.max_context

    available = available_bytes(resolve_device(model.device))  # before the models take their share
    # the target and what the drafter needs; the slots' target caches are the engine's rows
    builder, chosen = Builder.from_settings(model, drafting, progress, share_cache=False)
    target, draft = builder.target, builder.parts.draft
    first = builder.drafter(chosen, progress)  # validates the drafting values before anything large is allocated
    budget = int(srv.memory_budget_gb * GIB) if srv.memory_budget_gb is not None else default_budget(available)
    plan = plan_memory(target.module, draft.module if draft else None, capacity, srv.max_batch,
                       max(srv.prefill_chunk, k + 1 + first.caps.tree_nodes), budget,
                       drafter_bytes_per_slot=chosen.entry.slot_bytes(builder.options))
    plan.check()
    progress(f"memory: {plan.total / GIB:.3f} GiB of a {budget / GIB:.3f} GiB budget "
             f"({srv.max_batch} slots x {plan.kv_per_slot / GIB:.3f} GiB KV)")
    engine = builder.engine(chosen, EnginePlan.of(drafting, max_batch=srv.max_batch, prefill_chunk=srv.prefill_chunk,
                                                  prefix_cache=srv.prefix_cache), drafter=first)
    limit = k_schedule(srv.spec_off_batch, schedule) if (schedule or srv.spec_off_batch is not None) else None
    return Scheduler(engine, target.tokenizer, target.eos_ids, k=k, max_queue=srv.max_queue,
                     request_timeout=srv.request_timeout or None, k_for_batch=limit, metrics=ServerMetrics(),
                     memory=plan, model=target)


def serve(model: ModelSettings, drafting: DraftingSettings, srv: ServeSettings = ServeSettings()) -> int:
    """Build everything, then serve until SIGTERM/SIGINT (graceful: see app.Server)."""
    scheduler = build_scheduler(model, drafting, srv)
    app = create_app(scheduler, srv.served_model_name or model.model, srv.access(), srv.limits())
    server = make_server(app, scheduler, srv.host, srv.port, srv.shutdown_grace)
    server.run()
    return 0
