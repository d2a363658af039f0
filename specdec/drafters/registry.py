"""Drafters by name: what each needs loaded, its own settings and flags, and how it is built.

Each drafter module declares its drafters beside their classes, as `DRAFTERS = [(Entry(...), aliases)]`:
its name, what the builder must load for it (a draft model, a head, the layer-skip spec), whether it
drafts trees, its settings dataclass and the flags that fill it, the switch that picks it in generate
and serve, and `build(parts, options, note) -> Drafter`. This module finds them: every module of
the specdec.drafters package is imported on first use and its DRAFTERS registered. Its cost hints
(which model a draft token runs, how the measured costs are corrected, the tree sizes it offers the
policy) are methods of the drafter class (drafters/base.BaseDrafter).

A `Method` is a name as a command gives it (the CLI's `none`/`head`, the bench's
`plain`/`eagle`/`tree`/...) resolved to its entry. Nothing outside the drafter modules chooses a
drafter by comparing method names.

Adding a drafter: one new module in specdec/drafters/ holding its class and its DRAFTERS list
(docs/design.md shows one). A drafter defined elsewhere registers with `register(Entry(...))`.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping

import specdec.drafters as package
from specdec.config import TreeConfig
from specdec.errors import SpecdecError

if TYPE_CHECKING:
    from specdec.model import LoadedModel
    from specdec.model.kv_cache import KVCache

NO_TREES = "draft trees (--tree-budget / --tree-choices) need a draft model (--draft MODEL) or an EAGLE head (--head)"
DEFAULT_HEAD_KIND = "eagle"  # the kind of head --head names; other kinds load the one trained for the model


@dataclass(frozen=True)
class DraftOptions:
    """How drafters are built: the names of what to load, the shared knobs, and each drafter's own
    settings (`drafters`: entry name -> its settings object; `of(name)` falls back to the defaults)."""
    draft: str | None = None  # the draft model's name (as given)
    head: str | None = None  # the head's name, a directory, or 'auto'
    head_kind: str = DEFAULT_HEAD_KIND  # which head 'auto' looks for (eagle, medusa)
    layer_skip: str | None = None  # L, a layer list, or 'auto'
    layer_skip_file: str = "runs/layer_skip.json"
    tree: TreeConfig | None = None
    draft_vocab: int = 0
    p_min: float = 0.0
    window: int = 0
    drafters: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.draft_vocab < 0:
            raise SpecdecError(f"draft_vocab must be >= 0 (0 = full vocabulary), got {self.draft_vocab}")

    def of(self, name: str):
        """The settings of drafter `name` (its Entry.settings dataclass): as given, else its defaults."""
        if name in self.drafters:
            return self.drafters[name]
        return method(name).entry.settings()


@dataclass(frozen=True)
class Parts:
    """What the builder loaded, shared by every drafter built from it."""
    target: LoadedModel
    capacity: int  # the target's context (cache slots)
    draft: LoadedModel | None = None
    heads: dict = field(default_factory=dict)  # head kind -> its prepared head (PreparedHead, PreparedMedusa)
    layers: object = None  # layer skip's L or layer list
    cache: KVCache | None = None  # the target's cache, for a drafter that drafts into it (none in serve)


@dataclass(frozen=True)
class Entry:
    name: str
    build: Callable[[Parts, DraftOptions, Callable | None], Any]  # -> a drafters.base.Drafter
    describe: Callable[[Parts, DraftOptions, Any], str] = None  # a one-line label; default: the name
    draft_model: bool = False  # the builder loads the draft model (options.draft)
    head: bool = False  # the builder loads a head (options.head, options.head_kind)
    layers: bool = False  # the builder resolves the layer-skip spec (options.layer_skip)
    trees: bool = False  # takes --tree-budget / --tree-choices
    no_trees: str = NO_TREES  # the refusal when given a tree anyway
    drafts: bool = True  # False: plain decoding (takes no k)
    # the bench's theory check fits its chains: k drafts a step, each one draft-model forward (c, the
    # profile's draft cost when draft_model) or a free lookup, so a step costs k c + v(k + 1)
    chain_theory: bool = False
    slot_bytes: Callable[[DraftOptions], int] = lambda options: 0  # memory per server slot beyond the KV cache
    # its own settings: a frozen dataclass (validated on construction, all fields defaulted), the flags
    # that fill it (added to generate, serve and bench), and how: flag values by dest -> settings
    settings: type | None = None
    flags: Callable[[Any], None] | None = None  # (a parser) -> None: add_argument calls
    from_flags: Callable[[Mapping[str, Any]], Any] | None = None
    needs_switch: Mapping[str, str] = field(default_factory=dict)  # settings field -> its flag, read only when chosen
    # how generate and serve pick it: `switch` (help text) adds the on/off flag --NAME; `chosen_by` is
    # the set of flags that pick it (default: its own switch), the loader flags among them
    switch: str | None = None
    chosen_by: tuple[str, ...] | None = None

    def label(self, parts: Parts, options: DraftOptions, drafter) -> str:
        return self.describe(parts, options, drafter) if self.describe else self.name

    @property
    def switch_flag(self) -> str | None:
        return f"--{self.name}" if self.switch else None

    @property
    def picked_by(self) -> frozenset[str] | None:
        """The flags that pick it in generate and serve (None: only --drafter NAME picks it)."""
        if self.chosen_by is not None:
            return frozenset(self.chosen_by)
        return frozenset([self.switch_flag]) if self.switch else None


@dataclass(frozen=True)
class Method:
    """A name as given (CLI or bench), resolved to its entry."""
    name: str
    entry: Entry
    head_kind: str = DEFAULT_HEAD_KIND  # the head this name drafts with
    tree_sizes: bool = False  # bench: each tree size (the method's k) its own drafter

    def options(self, options: DraftOptions) -> DraftOptions:
        return replace(options, head_kind=self.head_kind)

    def build(self, parts: Parts, options: DraftOptions = DraftOptions(), note=None) -> Any:  # a drafters.base.Drafter
        return self.entry.build(parts, self.options(options), note)


_METHODS: dict[str, Method] = {}
_FOUND = False


def _find() -> None:
    """Registers the DRAFTERS of every module in the specdec.drafters package (once)."""
    global _FOUND
    if _FOUND:
        return
    _FOUND = True
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for entry, aliases in getattr(module, "DRAFTERS", ()):
            register(entry, **aliases)


def register(entry: Entry, **aliases: dict) -> None:
    """Adds a drafter under its name, and aliases: {name: Method fields besides name and entry}."""
    _find()
    for name, extra in {entry.name: {}, **aliases}.items():
        if name in _METHODS:
            raise ValueError(f"a drafter named {name!r} is registered already")
        _METHODS[name] = Method(name, entry, **extra)


def unregister(name: str) -> None:
    """Removes a drafter and its aliases."""
    _find()
    entry = _METHODS[name].entry
    for alias in [n for n, m in _METHODS.items() if m.entry is entry]:
        del _METHODS[alias]


def method(name: str) -> Method:
    _find()
    if name not in _METHODS:
        raise SpecdecError(f"unknown drafting method {name!r}; use one of {', '.join(_METHODS)}")
    return _METHODS[name]


def names() -> tuple[str, ...]:
    """Every registered name and alias."""
    _find()
    return tuple(_METHODS)


def entries() -> list[Entry]:
    """Every registered drafter once (aliases aside)."""
    _find()
    return list({id(m.entry): m.entry for m in _METHODS.values()}.values())


def build(name: str, parts: Parts, options: DraftOptions = DraftOptions(), note=None) -> Any:  # a drafters.base.Drafter
    """The drafter `name` over the loaded parts; `note` (a one-line log, or None) hears how it drafts."""
    return method(name).build(parts, options, note)


# ---- the command line's side: each drafter's flags, settings and switch ----

def add_flags(p) -> None:
    """Every drafter's own tuning flags (generate, serve and bench)."""
    for entry in entries():
        if entry.flags:
            entry.flags(p)


def add_switches(p) -> None:
    """Every drafter's on/off switch --NAME (generate and serve)."""
    for entry in entries():
        if entry.switch:
            p.add_argument(entry.switch_flag, action="store_true", help=entry.switch)


def settings_from_flags(values: Mapping[str, Any]) -> dict[str, Any]:
    """Each drafter's settings object from the parsed flags' values (by dest); validated on construction."""
    return {e.name: e.from_flags(values) for e in entries() if e.from_flags and e.flags}


def switches_from_flags(values: Mapping[str, Any]) -> frozenset[str]:
    """The switches given (--ngram, ...), where the command has them."""
    return frozenset(e.switch_flag for e in entries() if e.switch and values.get(e.name.replace("-", "_")))


def chosen(given: frozenset[str], drafters: Mapping[str, Any]) -> str:
    """The drafter that the flags given pick (switches and loader flags), 'none' for none; a drafter's
    settings that only it reads, set while another is chosen, are refused."""
    picked = [e for e in entries() if e.picked_by == given]
    if not picked and len(given) > 1:
        raise SpecdecError(f"choose one drafting method; got {' and '.join(sorted(given))}")
    name = picked[0].name if picked else "none"
    for entry in entries():
        for attr, flag in entry.needs_switch.items():
            value = getattr(drafters.get(entry.name, entry.settings()), attr)
            if entry.name != name and value != getattr(entry.settings(), attr):
                raise SpecdecError(f"{flag} is read by the {entry.name} drafter; add {entry.switch_flag}")
    return name
