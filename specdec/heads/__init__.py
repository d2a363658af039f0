"""Self-drafting heads (EAGLE, Medusa) trained by self-distillation on the target's own features.

data.py     training text: ShareGPT conversations, source files, the target's own answers
overlap.py  the guard that keeps evaluation prompts out of the training text
vocab.py    the draft vocabulary (most frequent training tokens) and its d2t / t2d maps
extract.py  the target's features and top-k distributions, in resumable shards
modules.py  the head modules (EAGLE, EAGLE-3 for imported checkpoints, Medusa)
train.py    the training loop, its resumable state and the validation estimate of acceptance
checkpoint.py  head files in the published EAGLE / Medusa layouts, with a target fingerprint
cli.py      `specdec train-head` and `specdec heads`
"""
