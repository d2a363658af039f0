"""Finding a trained head by name and making it ready to draft for its target."""

from __future__ import annotations

from pathlib import Path

from specdec.errors import SpecdecError
from specdec.heads.checkpoint import load_head, target_fingerprint
from specdec.heads.prepared import PreparedHead, PreparedMedusa
from specdec.model.registry import specdec_home

SHIPPED_HEADS = Path(__file__).resolve().parents[2] / "heads"  # trained heads committed beside the package


def heads_home() -> Path:
    """Where `specdec train-head` writes heads by default and `specdec heads` lists them."""
    return specdec_home() / "heads"


def default_out(model: str, kind: str) -> Path:
    """The directory of the `kind` head trained for `model` (a registry name or a file path)."""
    return heads_home() / f"{Path(model).name.removesuffix('.gguf')}-{kind}"


def load_head_for(name: str, target, model_name: str, kind: str = "eagle"):
    """The head `name` (a directory, a name under $SPECDEC_HOME/heads, or 'auto': the `kind` head that
    `specdec train-head --model MODEL` writes, else the one this checkout ships for MODEL in heads/),
    checked against the target (a LoadedModel) it drafts for, made ready to draft (PreparedHead for
    EAGLE, PreparedMedusa)."""
    path = default_out(model_name, kind) if name == "auto" else Path(name)
    shipped = SHIPPED_HEADS / path.name
    if name == "auto" and not path.is_dir() and shipped.is_dir():
        path = shipped
    if not path.is_dir() and (heads_home() / name).is_dir():
        path = heads_home() / name
    if not path.is_dir():
        raise SpecdecError(f"no head {name!r} (looked for the directory {path}); train one with `specdec train-head "
                           f"--model {model_name} --kind {kind} ...`, and `specdec heads` lists the installed ones")
    head, meta = load_head(path, target_fingerprint(target.module, target.tokenizer))
    if head.config.kind == "medusa":
        return PreparedMedusa(target.module, head)
    if head.config.kind != "eagle":
        raise SpecdecError(f"the head in {path} is an {head.config.kind} head; --head drafts with EAGLE and Medusa heads")
    return PreparedHead(target.module, head)
