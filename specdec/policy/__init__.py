"""Speculation policy: pick each step's action (plain, a chain of k, a token tree) from measured
costs and running acceptance, and decide whether a drafter's prefill pays.

`AdaptivePolicy.choose` (or `choose_action`, with trees) and `AdaptivePolicy.observe(outcome)` are
its face to the engine; `round_width` answers the server's batched round (one verify width for all
rows). The parts, none importing a later one:
  costs.py        v(n), c and the prefill's price in plain steps; `specdec profile` JSON; E(k), best k
  measure.py      those costs timed on this machine
  config.py       PolicyConfig (its k schedule from specdec.config.parse_schedule)
  estimates.py    the discounted Beta counter and the acceptance estimates built from it
  calibration.py  measured over predicted seconds
  confidence.py   the confidence rule and the target's confidence on plain steps
  admission.py    whether the drafter's prefill pays (admit, start_now)
  trees.py        token trees as further actions
  adaptive.py     AdaptivePolicy (the parts above as its mixins); round_width for a batched round
"""

from specdec.config import parse_schedule
from specdec.policy.adaptive import AdaptivePolicy, round_width
from specdec.policy.face import Action, Ask, FixedPolicy, Outcome, StepPolicy
from specdec.policy.config import PolicyConfig
from specdec.policy.costs import CostModel, best_k, expected_tokens, fit_prefill, interpolate, load_profile
from specdec.policy.estimates import CONF_EDGES, Beta, conf_bin
from specdec.policy.measure import forward_seconds, measure_costs, sync

__all__ = ["AdaptivePolicy", "round_width", "Outcome", "Action", "Ask", "FixedPolicy", "StepPolicy", "PolicyConfig", "parse_schedule", "CostModel", "best_k", "expected_tokens",
           "fit_prefill", "interpolate", "load_profile", "CONF_EDGES", "Beta", "conf_bin", "forward_seconds",
           "measure_costs", "sync"]
