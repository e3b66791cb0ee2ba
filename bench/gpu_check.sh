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
# `gpu` at most 100 s, one line each as it ends (the other tests need no GPU: CI runs
# them; the benches' own GPU tests are left out: the network bench is what the runs below
# do on real models, the kernels bench a minute of its own), and the rest shared by the
# models by weight, in order. A model is one process (bench/network.py --precision
# tf32,fp16,bf16,fp32 --rounds 2 --quick --no-compile): Ray, the model and PyTorch's eager
# and CUDA-graph baselines are set up once, each precision compiled from the records in
# bench/results/<gpu>/ and checked, then all timed interleaved. Tuning (--tune-seconds,
# resuming those records) goes to the precision with the fewest records, then the next,
# as far as the model's share leaves time after RUN_FIXED_S and PRECISION_S a precision,
# so that checks in turn tune each precision further: each tuned precision costs
# TUNE_FIXED_S beyond its budget and gets at least MIN_TUNE_S, or is not tuned
# (--tune-precisions), so every check still reaches its timings. BERT-base's run also times
# its tf32 network without the plan's rewrites (--plain tf32), which shows what they
# gain. A task without a record runs its untuned default (with tensor cores, small blocks
# that fill the GPU), which a tuned task's first round measures first.
# Each run is under `timeout` for its share less KILL_S, the grace its kill may take, so
# the whole never passes 480 s; a run that ends early leaves its time to the next.
set -uo pipefail

TOTAL_S=480
RESERVE_S=10
TESTS_S=100
KILL_S=3
# what a run spends besides tuning, as the check's runs on an H100 measured it: Ray, the
# model, PyTorch's baselines and the timing once (RUN_FIXED_S), each precision's compile,
# check and steps alone (PRECISION_S: 2-8 s to compile, the rest to time), and each tuned
# precision's actors and last round beyond its --tune-seconds (TUNE_FIXED_S: 16-32 s)
RUN_FIXED_S=25
PRECISION_S=12
TUNE_FIXED_S=25
MIN_TUNE_S=10
PRECISIONS=tf32,fp16,bf16,fp32  # every one compiled, checked and timed, and tuned where
# a model's share leaves time: the one with the fewest records first (ties in this order)
RUNS=(resnet18 mobilenet_v2 hf/BertModel)
TRIALS=100000  # a cap the time budget reaches first
declare -A WEIGHT=([resnet18]=12 [mobilenet_v2]=11 [hf/BertModel]=11)
# BERT-base also times, in these precisions, its network planned without the plan's
# rewrites (sibling kernels, permutes in place, tf32 weights rounded at packing): each
# one's extra compile, check and timing costs PLAIN_S
declare -A PLAIN=([hf/BertModel]=tf32)
PLAIN_S=5
TESTS=(tests/cuda tests/compile/test_cuda_network.py tests/actors/test_tune_cuda.py
       tests/test_bench.py tests/test_cli.py)
DESELECT=(tests/test_bench.py::test_network_bench_on_the_gpu
          tests/test_bench.py::test_kernels_bench_on_the_gpu)

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

least_tuned() {  # model: PRECISIONS, one a line, fewest records in $RESULTS first
  local p file
  for p in ${PRECISIONS//,/ }; do
    file="$RESULTS/network_${1//\//_}_cuda$([[ $p == fp32 ]] || echo "_$p").jsonl"
    echo "$(cat "$file" 2>/dev/null | wc -l) $p"
  done | sort -s -n -k1,1 | cut -d' ' -f2
}

run_model() {  # model, seconds: one bench/network.py run, its lines collected
  local m=$1 s=$2
  local n=$(( $(tr -cd , <<< "$PRECISIONS" | wc -c) + 1 ))  # precisions compiled
  local -a extra=()
  local plain=0
  if [[ -n "${PLAIN[$m]:-}" ]]; then
    extra=(--plain "${PLAIN[$m]}")
    plain=$(( $(tr -cd , <<< "${PLAIN[$m]}" | wc -c) + 1 ))
  fi
  local spare=$((s - KILL_S - RUN_FIXED_S - n * PRECISION_S - plain * PLAIN_S))
  local -a order
  mapfile -t order < <(least_tuned "$m")
  local k=${#order[@]} tune=0
  while ((k > 0)); do  # as many of them as get MIN_TUNE_S each
    tune=$((spare / k - TUNE_FIXED_S))
    ((tune >= MIN_TUNE_S)) && break
    k=$((k - 1))
  done
  local which=none
  ((k > 0)) && which=$(IFS=,; echo "${order[*]:0:k}")
  local budget=()
  ((k > 0)) && budget=(--tune-seconds "$tune")
  step "$s" python bench/network.py "$m" --target cuda --precision "$PRECISIONS" \
    --tune-precisions "$which" --trials "$TRIALS" "${budget[@]}" --rounds 2 --quick \
    --no-compile "${extra[@]}"
  local rc=$?
  [[ $DRY == 1 ]] && return
  cat "$STEP" >> "$LOG"
  local why="ok"
  if [[ $rc != 0 ]]; then
    why="exit status $rc"
    [[ $rc == 124 || $rc == 137 ]] && why="timed out after $((s - KILL_S)) s"
  fi
  collect "$m" "$PRECISIONS" "$why"
  say "$m: $why"
}

weights_left=0
for m in "${RUNS[@]}"; do weights_left=$((weights_left + WEIGHT[$m])); done
for m in "${RUNS[@]}"; do
  w=${WEIGHT[$m]}
  s=$(share "$w" "$weights_left" 1000)
  weights_left=$((weights_left - w))
  run_model "$m" "$s"
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
