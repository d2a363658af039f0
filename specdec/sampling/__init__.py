"""Pure sampling: logits -> probabilities (logits.py) and draft verification (rejection.py)."""
