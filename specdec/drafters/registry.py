"""Drafters by name: what each needs loaded and how it is built from the loaded parts.

An `Entry` is one drafter: its name, what the builder must load for it (a draft model, a head, the
layer-skip spec), whether it drafts trees, and
`build(parts, options, note) -> Drafter`. A `Method` is a name as a command gives it (the CLI's
`none`/`head`, the bench's `plain`/`eagle`/`tree`/...) resolved to its entry. Nothing outside this
module chooses a drafter by comparing method names.

Adding a drafter: one class in drafters/, then `register(Entry("mine", build=...))` (its module may
do it beside the class, or the table at the end of this file).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from specdec.config import LookaheadConfig, NgramConfig, SuffixConfig, TreeConfig
from specdec.errors import SpecdecError

if TYPE_CHECKING:
    from specdec.drafters.base import Drafter
    from specdec.model import LoadedModel
    from specdec.model.kv_cache import KVCache

NO_TREES = "draft trees (--tree-budget / --tree-choices) need a draft model (--draft MODEL) or an EAGLE head (--head)"
DEFAULT_HEAD_KIND = "eagle"  # the kind of head --head names; other kinds load the one trained for the model
SUFFIX_BYTES_PER_TOKEN = 512  # a mutable suffix automaton, per indexed token (drafters/suffix.py)


@dataclass(frozen=True)
class DraftOptions:
    """How drafters are built: the names of what to load and each drafter's tuning."""
    draft: str | None = None  # the draft model's name (as given)
    head: str | None = None  # the head's name, a directory, or 'auto'
    head_kind: str = DEFAULT_HEAD_KIND  # which head 'auto' looks for (eagle, medusa)
    layer_skip: str | None = None  # L, a layer list, or 'auto'
    layer_skip_file: str = "runs/layer_skip.json"
    ngram: NgramConfig = NgramConfig()
    suffix: SuffixConfig = SuffixConfig()
    lookahead: LookaheadConfig = LookaheadConfig()
    tree: TreeConfig | None = None
    draft_vocab: int = 0
    p_min: float = 0.0
    window: int = 0

    def __post_init__(self):
        if self.draft_vocab < 0:
            raise SpecdecError(f"draft_vocab must be >= 0 (0 = full vocabulary), got {self.draft_vocab}")


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
    build: Callable[[Parts, DraftOptions, Callable | None], Drafter]
    describe: Callable[[Parts, DraftOptions, Drafter], str] = None  # a one-line label; default: the name
    draft_model: bool = False  # the builder loads the draft model (options.draft)
    head: bool = False  # the builder loads a head (options.head, options.head_kind)
    layers: bool = False  # the builder resolves the layer-skip spec (options.layer_skip)
    trees: bool = False  # takes --tree-budget / --tree-choices
    no_trees: str = NO_TREES  # the refusal when given a tree anyway
    drafts: bool = True  # False: plain decoding (takes no k)
    slot_bytes: Callable[[DraftOptions], int] = lambda options: 0  # memory per server slot beyond the KV cache

    def label(self, parts: Parts, options: DraftOptions, drafter: Drafter) -> str:
        return self.describe(parts, options, drafter) if self.describe else self.name


@dataclass(frozen=True)
class Method:
    """A name as given (CLI or bench), resolved to its entry."""
    name: str
    entry: Entry
    head_kind: str = DEFAULT_HEAD_KIND  # the head this name drafts with
    tree_sizes: bool = False  # bench: each tree size (the method's k) its own drafter

    def options(self, options: DraftOptions) -> DraftOptions:
        return replace(options, head_kind=self.head_kind)

    def build(self, parts: Parts, options: DraftOptions = DraftOptions(), note=None) -> Drafter:
        return self.entry.build(parts, self.options(options), note)


_METHODS: dict[str, Method] = {}


def register(entry: Entry, **aliases: dict) -> None:
    """Adds a drafter under its name, and aliases: {name: Method fields besides name and entry}."""
    for name, extra in {entry.name: {}, **aliases}.items():
        if name in _METHODS:
            raise ValueError(f"a drafter named {name!r} is registered already")
        _METHODS[name] = Method(name, entry, **extra)


def unregister(name: str) -> None:
    """Removes a drafter and its aliases."""
    entry = _METHODS[name].entry
    for alias in [n for n, m in _METHODS.items() if m.entry is entry]:
        del _METHODS[alias]


def method(name: str) -> Method:
    if name not in _METHODS:
        raise SpecdecError(f"unknown drafting method {name!r}; use one of {', '.join(_METHODS)}")
    return _METHODS[name]


def names() -> tuple[str, ...]:
    """Every registered name and alias, in registration order."""
    return tuple(_METHODS)


def build(name: str, parts: Parts, options: DraftOptions = DraftOptions(), note=None) -> Drafter:
    """The drafter `name` over the loaded parts; `note` (a one-line log, or None) hears how it drafts."""
    return method(name).build(parts, options, note)


# ---- the drafters this package ships ----

def _none(parts, options, note):
    from specdec.drafters.base import NoDrafter
    return NoDrafter()


def _ngram(parts, options, note):
    from specdec.drafters.ngram import NgramDrafter
    return NgramDrafter(options.ngram.max_n, options.ngram.min_n)


def _suffix(parts, options, note):
    from specdec.datastore import load_datastore, tokenizer_fingerprint
    from specdec.drafters.suffix import SuffixDrafter
    s = options.suffix
    store = load_datastore(s.datastore, tokenizer_fingerprint(parts.target.tokenizer)) if s.datastore else None
    return SuffixDrafter(s.cache_tokens, s.min_match, store)


def _lookahead(parts, options, note):
    from specdec.drafters.lookahead import LookaheadDrafter
    la = options.lookahead
    return LookaheadDrafter(la.window, la.ngram, la.candidates)


def _layer_skip(parts, options, note):
    """Drafts into the target's cache: the engine's (Parts.cache), else its slot's row (serve's pool)."""
    from specdec.drafters.layer_skip import make_layer_skip
    return make_layer_skip(parts.target.module, parts.layers, parts.capacity, parts.cache, pooled=parts.cache is None)


def _draft(parts, options, note):
    from specdec.drafters.cross_tokenizer import model_drafter
    if parts.draft is None:
        raise SpecdecError("this drafting method needs a draft model (--draft MODEL)")
    return model_drafter(parts.target, parts.draft, parts.capacity, options, note)


def _head(parts, options, note):
    from specdec.drafters.eagle import EagleDrafter, MedusaDrafter, PreparedMedusa
    head = parts.heads.get(options.head_kind)
    if head is None:
        raise SpecdecError("this drafting method needs a head (--head NAME, or 'auto')")
    if isinstance(head, PreparedMedusa):
        if options.tree is not None and options.tree.choices is None:
            raise SpecdecError("a Medusa head drafts a static tree (--tree-choices), not --tree-budget")
        return MedusaDrafter(parts.target.module, head, parts.capacity, None if options.tree is None else options.tree.choices)
    return EagleDrafter(parts.target.module, head, parts.capacity, options.tree)


def _hybrid_of(model_build):
    def build(parts, options, note):
        from specdec.drafters.hybrid import HybridDrafter
        return HybridDrafter(model_build(parts, options, note), max_n=options.ngram.max_n, min_n=options.ngram.min_n)
    return build


def _head_label(parts, options, drafter):
    return f"{parts.heads[options.head_kind].config.kind} head {options.head}"


register(Entry("none", _none, lambda p, o, d: "plain", drafts=False), plain={})
register(Entry("draft", _draft, lambda p, o, d: f"draft {o.draft}", draft_model=True, trees=True),
         tree={"tree_sizes": True})
register(Entry("ngram", _ngram))
register(Entry("suffix", _suffix, slot_bytes=lambda o: SUFFIX_BYTES_PER_TOKEN * o.suffix.cache_tokens))
register(Entry("lookahead", _lookahead))
register(Entry("layer-skip", _layer_skip, lambda p, o, d: f"layer-skip {d.spec}", layers=True,
               no_trees="--layer-skip drafts chains; it does not take --tree-budget / --tree-choices"))
register(Entry("hybrid", _hybrid_of(_draft), lambda p, o, d: f"draft {o.draft} + prompt lookup", draft_model=True))
register(Entry("head", _head, _head_label, head=True, trees=True),
         eagle={}, **{"eagle-tree": {"tree_sizes": True}}, medusa={"head_kind": "medusa"})
register(Entry("head-hybrid", _hybrid_of(lambda p, o, n: _head(p, replace(o, tree=None), n)),
               lambda p, o, d: f"{_head_label(p, o, d)} + prompt lookup", head=True), **{"eagle-hybrid": {}})
