#!/bin/bash
# The serving A/B: AFTER and BEFORE checkouts (a git worktree each), alternating, concurrency 4 and 8.
#   AFTER=/path/after BEFORE=/path/before OUT=/path/out bash loadtest_ab.sh
for round in 1 2; do
  for tree in after before; do
    dir=$AFTER; [ $tree = before ] && dir=$BEFORE
    cd "$dir" && PYTHONPATH=$dir python -m specdec.cli loadtest \
      --model qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --modes off,policy,on \
      --concurrency 4,8 --min-requests 12 --max-tokens 128 --k 4 --out "$OUT/$tree-$round" > "$OUT/$tree-$round.log" 2>&1
  done
done
