"""Heads trained by self-distillation on the target's own features (the heads themselves, their
networks and checkpoints: specdec.heads).

data.py      training text: ShareGPT conversations, source files, the target's own answers
tasks.py     coding and text requests made for --self-generate
overlap.py   the guard that keeps evaluation prompts out of the training text
corpus.py    the corpus plan: chunks, held-out split, growing a saved plan
vocab.py     the draft vocabulary (most frequent training tokens) and its d2t / t2d maps
extract.py   the target's features and top-k distributions, in resumable shards; its own answers
train.py     the training loop, its resumable state and the validation estimate of acceptance
cli.py       `specdec train-head` and `specdec heads`
"""
