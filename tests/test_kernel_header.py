"""The kernel library's shared symbols are declared once, in kernels.h, and defined in one .c file: every
source compiles with every global function declared before its definition (-Wmissing-prototypes) and
none declared twice (-Wredundant-decls), so a hand-written extern beside the header fails, and so
does a global function the header does not declare. For the host's build and the other targets."""

import platform
import shutil
import subprocess

import pytest

from specdec.model import cpu_kernels

CHECKS = ["-fsyntax-only", "-std=c11", "-Wmissing-prototypes", "-Wredundant-decls", "-Werror"]
TARGETS = {"gcc": ["-march=native", "-march=x86-64-v3"], "aarch64-linux-gnu-gcc": ["-march=armv8.6-a+dotprod+i8mm",
                                                                                    "-march=armv8-a"]}


@pytest.mark.parametrize("cc,march", [(cc, m) for cc, marches in TARGETS.items() for m in marches])
def test_every_source_declares_its_shared_functions_only_through_kernels_h(cc, march):
    if not shutil.which(cc):
        pytest.skip(f"no {cc}")
    if cc == "gcc" and platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the x86 builds are checked on an x86 host")
    for source in cpu_kernels.SOURCES:
        proc = subprocess.run([cc, *CHECKS, march, str(source)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{source.name} ({march}):\n{proc.stderr[-2000:]}"


def test_kernels_h_is_in_the_build_key_and_every_source_includes_it():
    assert cpu_kernels.HEADERS[0].name == "kernels.h"
    for source in cpu_kernels.SOURCES:
        assert '#include "kernels.h"' in source.read_text(), source.name
