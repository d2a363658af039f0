"""specdec: lossless speculative decoding for Llama-family models."""

import os as _os
import sys as _sys

from specdec.errors import SpecdecError

__all__ = ["SpecdecError", "OMP_DEFAULTS", "peer_environ"]
__version__ = "0.1.0"

# OpenMP's waiting, for torch's libgomp, which our kernels share and which reads these once, when torch
# loads it. libgomp spins 300000 rounds (about 3 ms) at a barrier before it sleeps, but only 1000 once
# it manages more threads than there are CPUs: a server loads its models on one thread and steps them
# on another, so each thread keeps a team and the count passes the CPUs while only one team ever runs.
# Every parallel region then wakes its worker from sleep (a context switch), which cost a server a
# third of its speed on 2 cores. ACTIVE with the default spin count is libgomp's default without that
# throttle. Set only where torch is not loaded yet and the user set neither; MARK says specdec set them
# (our own child processes inherit them, and the mark).
OMP_DEFAULTS = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}
MARK = "SPECDEC_OMP_DEFAULTS"
if "torch" not in _sys.modules and not any(k in _os.environ for k in OMP_DEFAULTS):
    _os.environ.update(OMP_DEFAULTS, **{MARK: "1"})


def peer_environ() -> dict[str, str]:
    """This process's environment for another engine's programs (llama.cpp): without the OpenMP
    settings specdec itself put there, so that a peer runs as it would on its own."""
    env = dict(_os.environ)
    if env.pop(MARK, None):
        for k in OMP_DEFAULTS:
            env.pop(k, None)
    return env
