"""Per-step trace of draft:auto over prompts of the policy prompt set: each step's k, the estimates
it rested on (beta, pooled rate, rho_v, rho_spec, c, the plain steps' predicted-acceptance weight)
and its measured draft/verify seconds; and each start_now answer with its prefill terms. Shows why
the policy chose what it chose: a stalled verify, a draft model rented late.

Usage (repo root):
    python scripts/policy_trace.py 82,113,162,242,322,402 > runs/policy-trace-greedy.txt
    T=0.7 python scripts/policy_trace.py code-05 > runs/policy-trace-t07-code05.txt
"""
import os
import sys

from specdec.bench.compare import Comparison, parse_methods
from specdec.drafters.registry import DraftOptions, Parts
from specdec.bench.datasets import load_prompts
from specdec.model import load_model


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ids = sys.argv[1].split(",")
    target = load_model("qwen2.5-coder-1.5b-instruct", progress=lambda *a: None)
    draft = load_model("qwen2.5-coder-0.5b-instruct", progress=lambda *a: None)
    specs = parse_methods("draft", ["auto"])
    parts = Parts(target, 2048, draft, cache=target.module.new_cache(2048))
    comp = Comparison(parts, specs, 64, DraftOptions(draft_vocab=32768), cost_profile="docs/results/raw/profile-q8-draft-vocab.json",
                      temperature=float(os.environ.get("T", 0)), seed=1,
                      ignore_eos=float(os.environ.get("T", 0)) > 0)  # as the bench commands: --ignore-eos at T > 0
    pol = comp.engines[specs[0].label].policy
    log = []
    choose, observe_time, start_now = pol.choose, pol.observe_time, pol.start_now

    def traced_choose(*a, **kw):
        k = choose(*a, **kw)
        log.append(dict(k=k, beta=[round(b, 2) for b in pol.beta[:4]], pooled=round(pol.pooled, 3),
                        rho_v=round(pol.rho_v, 2), rho_spec=round(pol.rho_spec, 2), c=round(pol.draft_cost, 3),
                        sh=round(pol.shadow_trials, 1)))
        return k

    def traced_observe_time(k, ds, vs, *a, **kw):
        log[-1].update(ds=None if ds is None else round(ds, 3), vs=round(vs, 3), drafted=k)
        return observe_time(k, ds, vs, *a, **kw)

    def traced_start_now(*a):
        word = start_now(*a)
        log.append(dict(start_now=a, word=word, pooled=round(pol.pooled, 3),
                        terms=[round(x, 3) for x in pol._prefill_terms(a[0], a[2], 1)]))
        return word

    pol.choose, pol.observe_time, pol.start_now = traced_choose, traced_observe_time, traced_start_now
    prompts = [p for p in load_prompts("docs/results/prompts/policy.jsonl") if p.id in ids]
    if not prompts:
        sys.exit(f"no prompt of docs/results/prompts/policy.jsonl has an id in {ids}")
    for p in prompts:
        log.clear()
        rec = comp.run_one(p, specs[0], seed=1)
        print(p.id, p.category, round(rec.seconds, 2), "tokens", len(rec.tokens))
        for entry in log:
            print("   ", entry)


if __name__ == "__main__":
    main()
