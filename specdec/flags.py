"""Argument types shared by every command's flags (cli, server, loadtest)."""

from __future__ import annotations

import argparse


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
