"""The adaptive policy against every fixed k on simulated acceptance, with a measured cost curve.

Each scenario draws draft outcomes (position i passes with the scenario's probability, given the
ones before it passed), charges each step k c + v(k + 1) from a `specdec profile` JSON, and runs
requests of --tokens tokens, --requests per policy (the policy carries its prior from one to the
next, as a bench method or server slot does). It reports, per scenario, the policy's tokens per
unit time over the best fixed k's (k = 0, plain, included). Seeds are shared across methods.

This isolates the policy's decisions (learning, probing, ramp-up) from the host's timing noise,
which at the bench's sample sizes hides differences of 5% (docs/performance.md). It does not
replace the bench: real acceptance is not i.i.d., and real costs drift.

    python scripts/policy_sim.py --profile docs/results/raw/profile-q8-draft-vocab.json --out runs/policy-sim.json
"""

from __future__ import annotations

import argparse
import json
import random

from specdec.errors import SpecdecError
from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig, load_profile

SCENARIOS = {  # tokens emitted so far in the request -> acceptance rate of each draft position
    **{f"iid-{a}": (lambda a: lambda done: a)(a) for a in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)},
    "prose-then-code": lambda done: 0.4 if done < 24 else 0.9,  # a code block after prose
    "alternating-16": lambda done: 0.9 if (done // 16) % 2 else 0.3,  # quoted passages in new text
}


def parse_overrides(items: list[str]) -> dict:
    """['decay=0.1', 'probe_k=2'] -> {'decay': 0.1, 'probe_k': 2}, typed like PolicyConfig's defaults."""
    defaults, out = PolicyConfig(), {}
    for item in items:
        name, sep, value = item.partition("=")
        default = getattr(defaults, name, None)
        if not sep or isinstance(default, bool) or not isinstance(default, (int, float)):
            raise ValueError(f"--set takes FIELD=VALUE with a numeric PolicyConfig field, got {item!r}")
        try:
            out[name] = type(default)(value)
        except ValueError:
            raise ValueError(f"--set {name} needs a {type(default).__name__}, got {value!r}") from None
    return out


def run(costs: CostModel, scenario, seed: int, tokens: int, requests: int, fixed_k: int | None = None,
        cfg: PolicyConfig | None = None) -> float:
    policy = AdaptivePolicy(costs, cfg) if fixed_k is None else None
    rng, emitted, time = random.Random(seed), 0, 0.0
    for _ in range(requests):
        if policy is not None:
            policy.reset()
        done = 0
        while done < tokens:
            k = policy.choose() if policy is not None else fixed_k
            accepted = 0
            while accepted < k and rng.random() < scenario(done):
                accepted += 1
            if policy is not None:
                policy.observe(k, accepted)
            done += accepted + 1
            time += costs.step_time(k)
        emitted += done
    return emitted / time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="docs/results/raw/profile-q8-draft-vocab.json")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--k-max", type=int, default=8)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="a PolicyConfig field to change, e.g. --set decay=0.1 (repeatable)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    costs = CostModel.from_profile(load_profile(args.profile))
    try:
        cfg = PolicyConfig(k_max=args.k_max, **parse_overrides(args.set))
    except (ValueError, SpecdecError) as e:
        ap.error(str(e))
    rows = {}
    for name, scenario in SCENARIOS.items():
        fixed = {k: sum(run(costs, scenario, s, args.tokens, args.requests, k) for s in range(args.seeds)) / args.seeds
                 for k in range(args.k_max + 1)}
        best_k = max(fixed, key=fixed.get)
        auto = sum(run(costs, scenario, s, args.tokens, args.requests, None, cfg) for s in range(args.seeds)) / args.seeds
        rows[name] = {"best_fixed_k": best_k, "best_fixed_rate": round(fixed[best_k], 4), "auto_rate": round(auto, 4),
                      "auto_over_best": round(auto / fixed[best_k], 3), "auto_over_plain": round(auto / fixed[0], 3)}
        print(f"{name:16s} best fixed k={best_k} ({fixed[best_k]:.3f})  auto {auto:.3f}  "
              f"= {auto / fixed[best_k]:.3f} of best, {auto / fixed[0]:.3f} of plain", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"config": vars(args), "costs": {"verify_cost": costs.verify_cost, "draft_cost": costs.draft_cost},
                       "policy": {k: v for k, v in vars(cfg).items() if not isinstance(v, (dict, tuple)) or v},
                       "scenarios": rows}, f, indent=1)


if __name__ == "__main__":
    main()
