"""specdec sets libgomp's wait policy (ACTIVE, the default spin count: no throttle once a process has two
OpenMP teams) before torch loads it, unless the user set one; llama.cpp's programs get the environment
without it."""

import os
import subprocess
import sys

SHOW = ("import os, specdec; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), "
        "'OMP_WAIT_POLICY' in specdec.peer_environ())")


def run(code: str, **env) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SPECDEC_OMP_DEFAULTS")}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          check=True).stdout.split()


def test_set_before_torch_and_kept_from_peers():
    assert run(SHOW) == ["ACTIVE", "300000", "False"]


def test_the_users_own_setting_is_left_alone():
    assert run(SHOW, OMP_WAIT_POLICY="PASSIVE") == ["PASSIVE", "None", "True"]
    assert run(SHOW, GOMP_SPINCOUNT="1000") == ["None", "1000", "False"]


def test_not_set_once_torch_is_loaded():
    """libgomp read its settings when torch loaded it: setting them later would claim what is not so."""
    assert run("import torch; " + SHOW) == ["None", "None", "False"]


def test_a_child_of_specdec_keeps_them_and_its_peers_do_not():
    assert run(SHOW, OMP_WAIT_POLICY="ACTIVE", GOMP_SPINCOUNT="300000", SPECDEC_OMP_DEFAULTS="1") == \
        ["ACTIVE", "300000", "False"]
