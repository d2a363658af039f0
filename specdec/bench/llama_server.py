"""llama.cpp's own programs as a bench peer: `llama-server` on the same GGUF files, driven over HTTP.

- `llama`: plain decoding (a server without a draft).
- `llama-spec`: its speculative decoding with the same draft model (`llama-server -md DRAFT --spec-type
  draft-simple`), at its defaults, or `llama-spec:K` / `llama-spec:K@P` with its draft length capped at K
  (`--spec-draft-n-max`) and its draft-confidence cut at P (`--spec-draft-p-min`). These are server flags:
  this llama.cpp ignores them per request, so each setting gets its own server.
- `llama-lookup`: its prompt-lookup drafter (`--spec-type ngram-simple`, drafts of K tokens).

At most MAX_SERVERS servers run at once (each holds its own repacked copy of the weights); the least
recently used one stops to make room, and starts again (untimed) when its method's turn comes.

Every request sends the prompt as token ids, with prompt caching off (each run prefills, as ours do), and is
timed from send to the last byte; the same thread count as our engine. A build is found by `--llama-bin
DIR`, $SPECDEC_LLAMA_BIN, PATH, or `$SPECDEC_HOME/llama.cpp/src/build/bin` (`scripts/llama_cpp.sh build`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from specdec import peer_environ
from specdec.config import SamplingParams
from specdec.errors import SpecdecError
from specdec.model.registry import specdec_home

BINARY = "llama-server"
BUILD_HINT = "build one offline with `scripts/llama_cpp.sh build` (llama.cpp from the llama-cpp-python sdist)"


def _signal_hint(returncode: int) -> str:
    """What a llama-server killed by a signal most likely met: a native build whose instructions this CPU
    (or its hypervisor) refuses, as ggml's AMX kernels are on some KVM guests that advertise AMX."""
    if returncode not in (-signal.SIGILL, -signal.SIGSEGV):
        return ""
    return (f" ({signal.Signals(-returncode).name}: a build for instructions this machine refuses; "
            "`scripts/llama_cpp.sh build avx512` or `build x86-64-v3` builds without AMX, then pass --llama-bin)")


def find_binary(where: str | None = None) -> Path:
    """llama-server from --llama-bin (a directory or the binary), $SPECDEC_LLAMA_BIN, PATH, or the build
    `scripts/llama_cpp.sh build` makes; a clear error naming where it looked."""
    tried = []
    for source in (where, os.environ.get("SPECDEC_LLAMA_BIN")):
        if source:
            path = Path(source).expanduser()
            path = path / BINARY if path.is_dir() else path
            if path.is_file() and os.access(path, os.X_OK):
                return path
            tried.append(str(path))
            if source == where:
                raise SpecdecError(f"--llama-bin: no executable {BINARY} at {path}; {BUILD_HINT}")
    on_path = shutil.which(BINARY)
    if on_path:
        return Path(on_path)
    built = specdec_home() / "llama.cpp" / "src" / "build" / "bin" / BINARY
    if built.is_file():
        return built
    tried += ["PATH", str(built)]
    raise SpecdecError(f"the llama.cpp methods need {BINARY} (looked in {', '.join(tried)}); {BUILD_HINT}, "
                       f"or pass --llama-bin DIR")


def build_info(binary: Path) -> dict:
    """The build's version line (its commit) and compiler, from `llama-server --version`."""
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SpecdecError(f"{binary} --version failed: {e}") from None
    text = (out.stdout + out.stderr).strip().splitlines()
    info = {"binary": str(binary)}
    for line in text:
        if line.startswith("version:"):
            info["version"] = line.split(":", 1)[1].strip()
        elif line.startswith("built with"):
            info["built_with"] = line[len("built with"):].strip()
    return info


def _die_with_parent() -> None:
    """In the child before exec: on Linux, a SIGTERM when the bench's process dies (a killed bench must
    not leave servers spinning on the cores the next run measures)."""
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_spec_pin(pinned: str) -> tuple[int, float | None]:
    """'4' -> (4, None); '4@0.75' -> (4, 0.75): llama-spec's draft length and its p_min."""
    k, _, p = pinned.partition("@")
    try:
        k_val, p_val = int(k), (float(p) if p else None)
    except ValueError:
        raise SpecdecError(f"llama-spec takes :K or :K@P (its --spec-draft-n-max and --spec-draft-p-min), "
                           f"e.g. llama-spec:4@0.75; got {pinned!r}") from None
    if k_val < 1 or p_val is not None and not 0 <= p_val <= 1:
        raise SpecdecError(f"llama-spec:K@P needs K >= 1 and 0 <= P <= 1, got {pinned!r}")
    return k_val, p_val


class LlamaServer:
    """One llama-server process (a model, and a draft or none), started at construction, stopped by close()."""

    def __init__(self, binary: Path, model: Path, draft: Path | None, n_ctx: int, threads: int, log_path: Path,
                 extra: list[str] = ()):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [str(binary), "-m", str(model), "-c", str(n_ctx), "-t", str(threads), "-tb", str(threads),
               "-np", "1", "--host", "127.0.0.1", "--port", str(self.port), "--no-webui",
               "-lv", "4"]  # verbosity 4: its system_info line (CPU features, threads); nothing per token
        if draft is not None:
            cmd += ["-md", str(draft), "-td", str(threads), "-tbd", str(threads)]
        cmd += list(extra)
        self.cmd = cmd
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=peer_environ(), preexec_fn=_die_with_parent)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 300.0) -> None:
        import httpx
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise SpecdecError(f"llama-server exited with {self.proc.returncode}{_signal_hint(self.proc.returncode)}; "
                                   f"its log: {self.log_path}\n" + self.log_tail())
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.close()
        raise SpecdecError(f"llama-server did not become ready in {timeout:.0f} s; its log: {self.log_path}")

    def log_tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def system_info(self) -> str | None:
        """The 'system_info: ...' line the server logs at start (its CPU features and threads)."""
        try:
            for line in self.log_path.read_text(errors="replace").splitlines():
                if "system_info:" in line:
                    return re.sub(r"^.*?system_info:\s*", "", line).strip()
        except OSError:
            pass
        return None

    def complete(self, body: dict, timeout: float = 1800.0) -> dict:
        import httpx
        r = httpx.post(self.url + "/completion", json=body, timeout=timeout)
        if r.status_code != 200:
            raise SpecdecError(f"llama-server answered {r.status_code}: {r.text[:300]}")
        return r.json()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class LlamaServerPeer:
    """The llama, llama-spec and llama-lookup methods: a server each (plain; with the draft model,
    --spec-type draft-simple; with prompt lookup, --spec-type ngram-simple), started when first needed."""

    def __init__(self, binary: Path, model: Path, draft: Path | None, eos_ids: set[int], n_ctx: int,
                 threads: int, log_dir: Path):
        for path, what in ((model, "model"), (draft, "draft")):
            if path is not None and not str(path).endswith(".gguf"):
                raise SpecdecError(f"the llama.cpp methods need a .gguf {what}, got {path}")
        self.binary, self.model, self.draft, self.n_ctx, self.threads = binary, model, draft, n_ctx, threads
        self.eos = set(eos_ids)
        self.log_dir = log_dir
        self.servers: dict[str, LlamaServer] = {}
        self.last_counts: dict[str, int] = {}  # the last request's drafted and accepted tokens, as the server counts
        self.info = build_info(binary) | {"threads": threads}

    MAX_SERVERS = 3

    @staticmethod
    def server_flags(mode: str, k: int = 0, p_min: float | None = None) -> list[str]:
        """llama-server's flags for a mode: plain; spec (k = 0 and p_min None: its own defaults); lookup."""
        if mode == "plain":
            return []
        if mode == "spec":
            flags = ["--spec-type", "draft-simple"]
            if k:
                flags += ["--spec-draft-n-max", str(k), "--spec-draft-n-min", "0"]
            if p_min is not None:
                flags += ["--spec-draft-p-min", str(p_min)]
            return flags
        if mode == "lookup":
            return ["--spec-type", "ngram-simple"] + (["--spec-ngram-simple-size-m", str(k)] if k else [])
        raise SpecdecError(f"unknown llama-server mode {mode!r}")

    def server(self, mode: str, k: int = 0, p_min: float | None = None) -> LlamaServer:
        if mode == "spec" and self.draft is None:
            raise SpecdecError("the llama-spec method needs --draft MODEL")
        flags = self.server_flags(mode, k, p_min)
        key = " ".join([mode] + flags)
        if key in self.servers:
            self.servers[key] = self.servers.pop(key)  # most recently used last
        else:
            while len(self.servers) >= self.MAX_SERVERS:
                self.servers.pop(next(iter(self.servers))).close()
            name = mode if mode == "plain" else mode + (f"-k{k}" if k else "") + (f"-p{p_min}" if p_min is not None else "")
            srv = LlamaServer(self.binary, self.model, self.draft if mode == "spec" else None, self.n_ctx,
                              self.threads, self.log_dir / f"llama-server-{name}.log", flags)
            self.servers[key] = srv
            self.info.setdefault("system_info", srv.system_info())
        return self.servers[key]

    def generate(self, prompt: list[int], max_new_tokens: int, mode: str = "plain", k: int = 4,
                 sampling: SamplingParams = SamplingParams(), p_min: float | None = None,
                 json_schema: dict | None = None) -> tuple[list[int], float]:
        """mode: plain, spec (k = 0: the server's own draft settings) or lookup; sampling: ours, passed under
        llama-server's names (its penalties over our penalty_last_n window where set, else the whole context;
        its samplers in our order);
        json_schema: the answer under llama-server's own JSON Schema grammar."""
        body = {"prompt": prompt, "n_predict": max_new_tokens, "cache_prompt": False, "return_tokens": True,
                "stream": False, "seed": -1 if sampling.seed is None else sampling.seed,
                "repeat_penalty": sampling.repetition_penalty, "presence_penalty": sampling.presence_penalty,
                "frequency_penalty": sampling.frequency_penalty,
                "repeat_last_n": sampling.penalty_last_n or self.n_ctx}
        if json_schema is not None:
            body["json_schema"] = json_schema
        if not sampling.greedy:
            body["samplers"] = ["penalties", *sampling.order]
            body.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                        min_p=sampling.min_p, typical_p=1.0)
        else:
            body.update(temperature=0.0, top_k=1)
        srv = self.server(mode, k, p_min)
        t0 = time.perf_counter()
        out = srv.complete(body)
        seconds = time.perf_counter() - t0
        timings = out.get("timings") or {}
        self.last_counts = {key: int(timings[key]) for key in ("draft_n", "draft_n_accepted") if key in timings}
        tokens = list(out.get("tokens") or [])
        # the server stops at its end-of-generation tokens; cut at ours as our engine does
        for i, t in enumerate(tokens):
            if t in self.eos:
                tokens = tokens[:i + 1]
                break
        return tokens[:max_new_tokens], seconds

    def close(self) -> None:
        for srv in self.servers.values():
            srv.close()
        self.servers.clear()
