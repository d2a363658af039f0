#!/bin/sh
# Ours (speed.py) and llama.cpp (llama-bench: pp512, tg64) on the same file, taking turns, ROUNDS rounds.
# Usage: SPECDEC_HOME=... sh run.sh FILE [ROUNDS] > results.txt
set -e
here=$(dirname "$0")
bench="${SPECDEC_HOME:-$HOME/.cache/specdec}/llama.cpp/src/build/bin/llama-bench"
for r in $(seq "${2:-3}"); do
    echo "round $r ours $(python "$here/speed.py" "$1")"
    echo "round $r llama.cpp $("$bench" -m "$1" -t 2 -p 512 -n 64 -r 1 -o json | tr -d '\n' | sed 's/  */ /g')"
done
