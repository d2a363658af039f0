# step NAME SECONDS COMMAND...: what scripts/gpu_run.sh and gpu_serve.sh run each step through (sourced):
# the command under its cap, its output in $OUT/NAME.log, how it ended in $OUT/steps.txt, its tail shown.
step() {  # step NAME SECONDS COMMAND...: run it under the cap, keep its log, say how it ended
  local name=$1 cap=$2 t0=$SECONDS
  shift 2
  echo "== $name (cap ${cap}s)"
  timeout "$cap" "$@" >"$OUT/$name.log" 2>&1
  echo "$name rc=$? in $((SECONDS - t0))s" | tee -a "$OUT/steps.txt"
  tail -6 "$OUT/$name.log"
}
