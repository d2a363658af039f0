#!/usr/bin/env bash
# llama.cpp from the llama-cpp-python sdist on the package index (no other network needed).
#
#   scripts/llama_cpp.sh source   unpack llama.cpp's source (its convert_hf_to_gguf.py and gguf-py included)
#   scripts/llama_cpp.sh build    also build llama-server, llama-completion, llama-speculative-simple and
#                                 llama-bench: Release, GGML_NATIVE (a few minutes on 2 cores)
#
# Everything goes under $SPECDEC_HOME/llama.cpp (default ~/.cache/specdec/llama.cpp): the source in src/,
# the binaries in src/build/bin (what `specdec bench --llama-bin` and the tests look for). Idempotent.
set -euo pipefail
what="${1:-source}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
HOME_DIR="${SPECDEC_HOME:-$HOME/.cache/specdec}"
DEST="$HOME_DIR/llama.cpp"
PY="${PYTHON:-$(dirname "$0")/../.venv/bin/python}"
[ -x "$PY" ] || PY=python3

if [ ! -f "$DEST/src/convert_hf_to_gguf.py" ]; then
    mkdir -p "$DEST/download"
    "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$DEST/download"
    tar -xzf "$DEST/download/llama_cpp_python-$VERSION.tar.gz" -C "$DEST/download"
    rm -rf "$DEST/src"
    mv "$DEST/download/llama_cpp_python-$VERSION/vendor/llama.cpp" "$DEST/src"
    rm -rf "$DEST/download"
fi
echo "llama.cpp source: $DEST/src"

if [ "$what" = build ]; then
    cache="$DEST/src/build/CMakeCache.txt"
    if [ -L "$DEST/src/build" ] && [ ! -e "$DEST/src/build" ]; then
        rm "$DEST/src/build"   # a link to a build folder that is gone
    fi
    if [ -f "$cache" ] && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$DEST/src" "$cache"; then
        rm -rf "$cache" "$DEST/src/build/CMakeFiles"   # configured from another source path: configure afresh
    fi
    cmake -S "$DEST/src" -B "$DEST/src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF > "$DEST/cmake.log"
    cmake --build "$DEST/src/build" -j "$(nproc)" \
        --target llama-server llama-completion llama-speculative-simple llama-bench > "$DEST/build.log"
    echo "llama.cpp binaries: $DEST/src/build/bin"
elif [ "$what" != source ]; then
    echo "usage: $0 [source|build]" >&2
    exit 2
fi
