#!/usr/bin/env bash
# A GPU check in minutes, on a bare GPU machine: the tests that need a GPU, then ResNet-18,
# MobileNetV2 and BERT-base tuned briefly, compiled and timed against PyTorch in each
# precision, all in at most 8 minutes.
#
#   bench/gpu_check.sh [--dry-run] [OUTDIR]
#
# OUTDIR (default: $OUT where set, else bench/results/<gpu>/) receives at most three files:
# gpu_check.log (everything every step printed), gpu_check.jsonl (one JSON line per model
# and precision: the run's own line for it, or what became of it) and, where OUTDIR is not
# bench/results/<gpu>/, records.tar.gz (the records the runs wrote there, to unpack into
# that folder). A step that fails or runs out of time is logged and the next one runs.
# --dry-run prints each command with the seconds it would be given, and runs nothing.
#
# Where no package registry is, Ray, PuLP, XGBoost and jsonschema come from the bundle that
# ../shared/gpu/make_bundle.sh makes (docs/gpu.md, "Checking on a GPU machine"):
#   mkdir -p .gpu/site && tar -xJf .gpu/site.tar.xz -C .gpu/site && export PYTHONPATH=$PWD/.gpu/site:$PWD
#
# Time. 480 s in all: up to 10 s to name the GPU and pack the records, the tests marked
# `gpu` at most 110 s, one line each as it ends (the other tests need no GPU: CI runs
# them; the network bench's own GPU test is left to the runs below, which do what it
# does on real models), and the rest shared by the runs, in order. A run is one process
# (bench/network.py --precision P,Q --rounds 2 --quick --no-compile): Ray, the model and
# PyTorch's eager and CUDA-graph baselines are set up once, and each precision is tuned,
# compiled and checked in turn, then all timed interleaved. The runs users run come
# first, tf32 and fp16 of every model, sharing by weight; fp32 and bf16 follow in the
# time they leave, a run with less than MIN_RUN_S left skipped and logged.
# Each run is under `timeout` for its share less KILL_S, the grace its kill may take, so
# the whole never passes 480 s; a run that ends early leaves its time to the next.
# Tuning is bounded by time, not trials (--tune-seconds): each precision gets what its
# run's share leaves after RUN_FIXED_S and PRECISION_S a precision (at least MIN_TUNE_S),
# resuming the records already in bench/results/<gpu>/, so every check tunes a little
# further and still reaches its timing. A task's first round measures its untuned
# default (with tensor cores, small blocks that fill the GPU) before anything else.
set -uo pipefail

TOTAL_S=480
RESERVE_S=10
TESTS_S=110
KILL_S=3
MIN_RUN_S=60
# what a run spends besides tuning, as the check's runs measured it: Ray, the model and
# PyTorch's baselines once, then each precision's compile, check, timing and steps alone
# (17-38 s)
RUN_FIXED_S=25
PRECISION_S=30
MIN_TUNE_S=5
# model:precisions, one process each, in the order they run: the main runs share what is
# left by weight, the extra runs what the main ones leave
RUNS=(resnet18:tf32,fp16 mobilenet_v2:tf32,fp16 hf/BertModel:tf32,fp16)
EXTRA=(resnet18:fp32,bf16 mobilenet_v2:fp32,bf16 hf/BertModel:fp32,bf16)
TRIALS=100000  # a cap the time budget reaches first
declare -A WEIGHT=([resnet18]=12 [mobilenet_v2]=11 [hf/BertModel]=11)
TESTS=(tests/cuda tests/compile/test_cuda_network.py tests/actors/test_tune_cuda.py
       tests/test_bench.py tests/test_cli.py)
DESELECT=(tests/test_bench.py::test_network_bench_on_the_gpu)

DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
cd "$(dirname "$0")/.." || exit 2
START=$SECONDS

say() { echo "$*"; [[ $DRY == 1 ]] || echo "$*" >> "$LOG"; }

# seconds for the next step: its weight's share of what is left (less the reserve), capped
share() {  # weight, weights of the steps still to run (this one included), cap
  local left=$((START + TOTAL_S - RESERVE_S - SECONDS))
  [[ $DRY == 1 ]] && left=$((TOTAL_S - RESERVE_S - SPENT))
  local s=$((left * $1 / $2))
  ((s > $3)) && s=$3
  echo $((s > 0 ? s : 0))
}

step() {  # seconds, command...: run it under timeout, its output to $STEP
  local s=$1; shift
  local t=$((s - KILL_S))
  say "\$ timeout -k $KILL_S $t $*"
  SPENT=$((SPENT + s))
  [[ $DRY == 1 ]] && return 0
  if ((t < 1)); then echo "no time left" > "$STEP"; return 124; fi
  timeout -k "$KILL_S" "$t" "$@" > "$STEP" 2>&1
}

gpu_line() {  # "NAME<TAB>FOLDER" of torch's GPU; nothing, and why on stderr, without one
  python - <<'EOF'
import sys
sys.path.insert(0, "bench")
from network import gpu_folder
from raytune_kernels.cuda.torch_timing import gpu_name, gpu_problem
problem = gpu_problem()
print(f"{gpu_name()}\t{gpu_folder(gpu_name())}" if problem is None else problem,
      file=sys.stdout if problem is None else sys.stderr)
EOF
}

if [[ $DRY == 1 ]]; then
  GPU="<gpu>"; RESULTS="bench/results/<gpu>"
else
  nvidia-smi -L 2>&1 || true
  IFS=$'\t' read -r GPU FOLDER <<< "$(gpu_line)"
  if [[ -z "${GPU:-}" ]]; then
    echo "bench/gpu_check.sh: no GPU to check (torch and cupy see none, or the project does" \
      "not import: PYTHONPATH?)" >&2
    exit 2
  fi
  RESULTS="bench/results/$FOLDER"
fi
OUTDIR=${1:-${OUT:-$RESULTS}}
LOG="$OUTDIR/gpu_check.log"
JSONL="$OUTDIR/gpu_check.jsonl"
SPENT=0
if [[ $DRY == 0 ]]; then
  mkdir -p "$OUTDIR" "$RESULTS"
  : > "$LOG"; : > "$JSONL"
  STAMP=$(mktemp); STEP=$(mktemp); trap 'rm -f "$STAMP" "$STEP"' EXIT
fi
say "GPU: $GPU; results in $OUTDIR (records: $RESULTS)"
if [[ $DRY == 0 ]] && ! python -c "import ray, pulp, xgboost" 2>/dev/null; then
  say "Ray, PuLP or XGBoost missing: unpack ../shared/gpu/make_bundle.sh's bundle (docs/gpu.md)"
fi

for t in "${TESTS[@]}"; do [[ -e $t ]] || say "missing test path: $t"; done
step "$(share 1 1 "$TESTS_S")" env RK_FAILURES_AT_ONCE=1 python -m pytest -v -m "gpu and not slow" -rfE \
  --durations=10 \
  "${DESELECT[@]/#/--deselect=}" "${TESTS[@]}"
rc=$?
[[ $DRY == 1 ]] || { cat "$STEP" >> "$LOG"; tail -n 1 "$STEP"; say "GPU tests: exit status $rc"; }

collect() {  # model, precisions, why: each precision's JSON line from the run, else why not
  python - "$STEP" "$1" "$2" "$GPU" "$3" >> "$JSONL" <<'EOF'
import json, sys
step, model, precisions, gpu, why = sys.argv[1:]
lines = {}
for line in open(step, errors="replace"):
    try:
        run = json.loads(line) if line.startswith("{") else None
    except ValueError:
        run = None
    if isinstance(run, dict) and "precision" in run:
        lines[run["precision"]] = line.strip()
for p in precisions.split(","):
    print(lines.get(p) or json.dumps({"model": model, "precision": p, "device": gpu,
                                      "error": "no JSON line" if why == "ok" else why}))
EOF
}

run_model() {  # model:precisions, seconds: one bench/network.py run, its lines collected
  local m=${1%:*} p=${1#*:} s=$2
  local n=$(( $(tr -cd , <<< "$p" | wc -c) + 1 ))  # precisions in the run
  local tune=$(( (s - KILL_S - RUN_FIXED_S - n * PRECISION_S) / n ))
  ((tune < MIN_TUNE_S)) && tune=$MIN_TUNE_S
  step "$s" python bench/network.py "$m" --target cuda --precision "$p" \
    --trials "$TRIALS" --tune-seconds "$tune" --rounds 2 --quick --no-compile
  local rc=$?
  [[ $DRY == 1 ]] && return
  cat "$STEP" >> "$LOG"
  local why="ok"
  if [[ $rc != 0 ]]; then
    why="exit status $rc"
    [[ $rc == 124 || $rc == 137 ]] && why="timed out after $((s - KILL_S)) s"
  fi
  collect "$m" "$p" "$why"
  say "$m $p: $why"
}

weights_left=0
for r in "${RUNS[@]}"; do weights_left=$((weights_left + WEIGHT[${r%:*}])); done
for r in "${RUNS[@]}"; do
  w=${WEIGHT[${r%:*}]}
  s=$(share "$w" "$weights_left" 1000)
  weights_left=$((weights_left - w))
  run_model "$r" "$s"
done
for i in "${!EXTRA[@]}"; do
  r=${EXTRA[$i]}
  s=$(share 1 $((${#EXTRA[@]} - i)) 1000)
  if ((s < MIN_RUN_S)); then
    say "${r%:*} ${r#*:}: skipped, $s s left (a run needs $MIN_RUN_S)"
    [[ $DRY == 1 ]] || collect "${r%:*}" "${r#*:}" "skipped: $s s left of the check's $TOTAL_S"
    continue
  fi
  run_model "$r" "$s"
done

if [[ $DRY == 0 && "$(realpath "$OUTDIR")" != "$(realpath "$RESULTS")" ]]; then
  mapfile -t new < <(cd "$RESULTS" && find . -maxdepth 1 -name 'network_*_cuda*.jsonl' \
                     -newer "$STAMP")
  ((${#new[@]})) && tar -czf "$OUTDIR/records.tar.gz" -C "$RESULTS" "${new[@]}"
fi
if [[ $DRY == 1 ]]; then
  say "planned: at most $SPENT s of steps, $TOTAL_S s in all"
else
  say "done in $((SECONDS - START)) s"
fi
