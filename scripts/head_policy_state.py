"""The adaptive policy's state at the start of each request, for the shipped EAGLE head over the
first N prompts of the heads' Spec-Bench prompt file, run in order by one engine (as the bench runs
them): the carried prior, rho_v, rho_spec, the measured price of a draft token (c_eff), the first
positions' acceptance estimates, the probe interval and the best k a 0.9-accurate drafter would get;
then the request's steps that drafted. Shows whether the policy can still come back to drafting.

Usage (repo root): python scripts/head_policy_state.py [--prompts 13] > runs/head-policy-state.txt
"""

import argparse
import json
from pathlib import Path

from specdec.config import GenerationConfig
from specdec.engine.generate import SpeculativeGenerator
from specdec.model import load_model
from specdec.model.tokenizer import encode_messages
from specdec.drafters.registry import Parts, build
from specdec.engine.policy_build import build_policy
from specdec.heads.find import load_head_for

MODEL = "qwen2.5-coder-1.5b-instruct"
PROMPTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "prompts" / "heads-specbench.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=13)
    args = ap.parse_args()
    lm = load_model(MODEL, progress=lambda *a: None)
    drafter = build("head", Parts(lm, 4096, heads={"eagle": load_head_for("auto", lm, MODEL)}))
    policy = build_policy(drafter, lm, 8)
    engine = SpeculativeGenerator(lm.module, drafter, 4096, policy)
    for line in PROMPTS.read_text().splitlines()[:args.prompts]:
        p = json.loads(line)
        ids = encode_messages(lm.tokenizer, [{"role": "user", "content": p.get("prompt") or p["turns"][0]}])
        print(f"{p.get('id')} {p.get('category')}: prior {policy.prior:.3f} rho_v {policy.rho_v:.3f} "
              f"rho_spec {policy.rho_spec:.3f} c_eff {policy.draft_cost:.3f} "
              f"beta {[round(b, 2) for b in policy.beta[:3]]} interval {policy.interval} "
              f"best k at 0.9: {policy._best_k([0.9] * 8, 8)[0]}", flush=True)
        out = engine.generate(ids, GenerationConfig(128, 8))
        print(f"    steps {out.stats.steps} drafted {out.stats.drafted} accepted {out.stats.accepted}", flush=True)


if __name__ == "__main__":
    main()
