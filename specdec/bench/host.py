"""The host a measurement ran on, as the raw records name it."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU model as lscpu names it (/proc/cpuinfo's model name), its family and model, and the cores."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return (f"{info.get('model name') or platform.processor() or '?'}, CPU family {info.get('cpu family', '?')}, "
            f"model {info.get('model', '?')}, {os.cpu_count()} cores")
