"""How the package's internal imports sit: the total, and the deferred ones (inside a function or a
class) outside the CLI modules, which the layers allow only for an optional heavy dependency.

    .venv/bin/python scripts/import_report.py [--package specdec] [--cli specdec/cli.py ...]

Prints the counts, the deferred share of all internal imports, and each deferred import as
file:line module. An import counts once per statement; `if TYPE_CHECKING:` blocks at module level
are module-level imports.
"""
from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass
from pathlib import Path

CLI_MODULES = ("specdec/cli.py", "specdec/training/cli.py")


@dataclass(frozen=True)
class Import:
    path: str
    line: int
    module: str
    deferred: bool


def _module_of(node: ast.Import | ast.ImportFrom, package: str, path: Path) -> list[str]:
    """The absolute module names one import statement names (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        return [node.module or ""]
    base = list(path.with_suffix("").parts)[: -node.level]
    return [".".join(base + ([node.module] if node.module else []))]


def _walk(tree: ast.AST, deferred: bool = False):
    """Every import statement with whether it sits inside a function or class body."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, deferred
        inner = deferred or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
        yield from _walk(node, inner)


def internal_imports(root: Path, package: str) -> list[Import]:
    found = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root)
        for node, deferred in _walk(ast.parse(path.read_text(), str(rel))):
            for module in _module_of(node, package, rel):
                if module == package or module.startswith(package + "."):
                    found.append(Import(rel.as_posix(), node.lineno, module, deferred))
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--package", default="specdec")
    parser.add_argument("--cli", nargs="*", default=list(CLI_MODULES), help="the CLI modules (paths from the root)")
    args = parser.parse_args(argv)
    found = internal_imports(args.root, args.package)
    deferred = [i for i in found if i.deferred and i.path not in args.cli]
    in_cli = [i for i in found if i.deferred and i.path in args.cli]
    share = len(deferred) / len(found) if found else 0.0
    print(f"internal imports: {len(found)}")
    print(f"deferred in the CLI modules ({', '.join(args.cli)}): {len(in_cli)}")
    print(f"deferred outside the CLI modules: {len(deferred)} ({share:.1%} of all internal imports)")
    for i in deferred:
        print(f"  {i.path}:{i.line} {i.module}")


if __name__ == "__main__":
    main()
