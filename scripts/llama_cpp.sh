#!/usr/bin/env bash
# llama.cpp from the llama-cpp-python sdist on the package index (no other network needed).
#
#   scripts/llama_cpp.sh source   unpack llama.cpp's source (its convert_hf_to_gguf.py and gguf-py included)
#   scripts/llama_cpp.sh build [TARGET]
#                                 also build llama-server, llama-completion, llama-speculative-simple and
#                                 llama-bench: Release, for TARGET (default native: GGML_NATIVE; a few minutes
#                                 on 2 cores). x86-64-v3 and x86-64-v3+avxvnni build for those targets
#                                 (GGML_NATIVE off, AVX2/FMA/F16C/BMI2, and AVX-VNNI), as SPECDEC_CPU_TARGET
#                                 builds our kernels, so both are measured on one host for one target.
#                                 avx512: AVX-512 with VBMI, VNNI and BF16 but no AMX (a Zen 4/5's set,
#                                 for a host whose native build would take AMX).
#
# Everything goes under $SPECDEC_HOME/llama.cpp (default ~/.cache/specdec/llama.cpp): the source in src/,
# the binaries in src/build/bin (native: what `specdec bench --llama-bin` and the tests look for) or
# src/build-TARGET/bin. Idempotent.
set -euo pipefail
what="${1:-source}"
target="${2:-native}"
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
    case "$target" in
        native) build="$DEST/src/build"; isa=(-DGGML_NATIVE=ON) ;;
        x86-64-v3) build="$DEST/src/build-$target"
            isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON) ;;
        x86-64-v3+avxvnni) build="$DEST/src/build-$target"
            isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                 -DGGML_AVX_VNNI=ON) ;;
        avx512) build="$DEST/src/build-$target"
            isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                 -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON) ;;
        *) echo "$0: unknown target $target (native, x86-64-v3, x86-64-v3+avxvnni, avx512)" >&2; exit 2 ;;
    esac
    cache="$build/CMakeCache.txt"
    if [ -L "$build" ] && [ ! -e "$build" ]; then
        rm "$build"   # a link to a build folder that is gone
    fi
    if [ -f "$cache" ] && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$DEST/src" "$cache"; then
        rm -rf "$cache" "$build/CMakeFiles"   # configured from another source path: configure afresh
    fi
    cmake -S "$DEST/src" -B "$build" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF > "$DEST/cmake-$target.log"
    cmake --build "$build" -j "$(nproc)" \
        --target llama-server llama-completion llama-speculative-simple llama-bench > "$DEST/build-$target.log"
    echo "llama.cpp binaries: $build/bin"
elif [ "$what" != source ]; then
    echo "usage: $0 [source|build [native|x86-64-v3|x86-64-v3+avxvnni|avx512]]" >&2
    exit 2
fi
