"""Self-drafting heads (EAGLE, Medusa): what a drafter needs to run one. They sit below the drafters;
making them (specdec.training) sits above the engine.

modules.py     the head modules (EAGLE, EAGLE-3 for imported checkpoints, Medusa)
checkpoint.py  head files in the published EAGLE / Medusa layouts, with a target fingerprint
prepared.py    a head made ready for its target (Q8_0 layers on the CPU backend, the target's LM head rows)
find.py        a head by name, directory or 'auto', checked against its target and prepared
"""
