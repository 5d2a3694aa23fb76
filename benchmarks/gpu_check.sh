#!/usr/bin/env bash
# `make gpu-check`: the first command to run on a machine with GPUs.
#
# N = the GPUs torch sees (torch.cuda.device_count(); nvidia-smi only to notice a CPU build
# of torch on a GPU machine). The checks run on R ranks, one per GPU, R = the largest of
# 8, 4, 2, 1 not above N (the small Llamas have 8 heads, and the full plan splits their
# sequence over the ranks). Each check prints ONE verdict line, "PASS ...", "FAIL ..." or
# "SKIP ... (why)":
#   a1. the demo under torchrun, full plan, float64, 10 steps: "check against the single-device model: OK"
#   a2. the same with --plan vanilla
#   a3. the same with --dp 2 (PyTorch's DDP over two TP groups), when R >= 4
#   b.  the transition table under torchrun (-m tensorplay_edu.demo --transitions)
#   c.  no host synchronisation in a training step of either plan: benchmarks/gpu_sync_check.py
#       (torch.cuda.set_sync_debug_mode, and a TorchDispatchMode counting .item() and friends)
#   d.  bf16 step time of the full plan, ours against PyTorch's own TP:
#       benchmarks/bench.py --torchrun --dtype bfloat16, --impl ours then --impl torch
#   d2. float8 step time of the full plan, ours only (PyTorch's float8 TP needs torchao): the bf16
#       model with --float8 against ours in bf16 (d's run, or its own if d has none); SKIP on GPUs
#       below compute capability 8.9 (no float8 matmuls for torch._scaled_mm)
#   d3. async TP step time of the full plan, ours bf16: synchronous (d's run, or its own if d has none)
#       against --async-tp (each ring step's isend / irecv on NCCL's stream, the matmuls on the compute
#       stream); bench.py itself fails unless the async step moves the synchronous step's bytes
# The exit status is 1 if any check FAILs, else 0. Every check has its own timeout
# (GPU_CHECK_TIMEOUT, default 600 s) and the script goes on after a failure; a FAIL line
# names its log and the log's last lines follow it, indented. Logs: GPU_CHECK_LOGS
# (default a fresh folder under /tmp).
#
# No CUDA device visible (a laptop, CI): every check prints "SKIP ... (no CUDA device
# visible)" and the exit status is 0.
#
# Knobs: GPU_CHECK_RANKS=2 runs the checks on 2 CPU ranks (gloo) where no CUDA device is
# visible, a dry run of this script itself (minutes on 2 cores); BENCH_CONFIG (default
# medium) is bench.py's --config for d; VENV (default .venv) holds python and torchrun.

set -u
cd "$(dirname "$0")/.." || exit 2
VENV=${VENV:-.venv}
PY=$VENV/bin/python
TORCHRUN=$VENV/bin/torchrun
TIMEOUT=${GPU_CHECK_TIMEOUT:-600}
BENCH_CONFIG=${BENCH_CONFIG:-medium}
FAILED=0

# Each check: an id and what it checks (the verdict line's words).
IDS=(a1 a2 a3 b c d d2 d3)
declare -A WHAT=(
  [a1]="a1. demo, full plan, float64, under torchrun"
  [a2]="a2. demo, vanilla plan, float64, under torchrun"
  [a3]="a3. demo, DP x TP (--dp 2), under torchrun"
  [b]="b. transition table (demo --transitions) under torchrun"
  [c]="c. host syncs in a training step (gpu_sync_check.py)"
  [d]="d. bf16 step time, full plan, ours vs PyTorch's TP (bench.py --torchrun)"
  [d2]="d2. float8 step time, full plan, bf16 model, ours float8 vs ours bf16 (bench.py --torchrun --float8)"
  [d3]="d3. async TP step time, full plan, bf16, ours async vs ours sync (bench.py --torchrun --async-tp)"
)

skip_all() {  # every check: SKIP (why)
  for id in "${IDS[@]}"; do echo "SKIP ${WHAT[$id]} ($1)"; done
}

fail() {  # id, why, log: the verdict, then the log's last lines
  echo "FAIL ${WHAT[$1]}: $2 (log: $3)"
  grep -v -e '^W[0-9]' -e '^\*\*\*' -e 'OMP_NUM_THREADS' "$3" 2>/dev/null | tail -n 12 | sed 's/^/    | /'
  FAILED=1
}

# run_check ID WANT COMMAND...: PASS when COMMAND exits 0 within the timeout and its output has the line WANT.
run_check() {
  local id=$1 want=$2 log="$LOGS/$1.log" start=$SECONDS rc
  shift 2
  timeout -k 30 "$TIMEOUT" "$@" >"$log" 2>&1
  rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    fail "$id" "timed out after $TIMEOUT s" "$log"
  elif [ "$rc" -ne 0 ]; then
    fail "$id" "exit status $rc" "$log"
  elif ! grep -qF -- "$want" "$log"; then
    fail "$id" "exit status 0 but no line \"$want\"" "$log"
  else
    echo "PASS ${WHAT[$id]} on $R rank(s): $want ($((SECONDS - start)) s)"
  fi
}

# What torch sees: GPU count, torch version, CUDA version.
PROBE_PY='import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0, torch.__version__, torch.version.cuda)'
if ! PROBE=$("$PY" -c "$PROBE_PY" 2>/dev/null); then
  echo "FAIL setup: $PY cannot import torch (run make setup)"
  skip_all "torch did not import"
  exit 1
fi
read -r N TORCH_VERSION CUDA_VERSION <<<"$PROBE"

if [ "$N" -eq 0 ]; then
  SMI=0
  if [ -z "${CUDA_VISIBLE_DEVICES+set}" ] && command -v nvidia-smi >/dev/null 2>&1; then
    SMI=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  fi
  if [ "$SMI" -gt 0 ]; then  # GPUs on the machine, none for torch: a CPU build, or a driver problem
    echo "FAIL setup: nvidia-smi lists $SMI GPU(s) but torch $TORCH_VERSION (CUDA $CUDA_VERSION) sees none:" \
      "install a CUDA build of torch into $VENV"
    skip_all "no CUDA device visible to torch"
    exit 1
  fi
  if [ -z "${GPU_CHECK_RANKS:-}" ]; then
    skip_all "no CUDA device visible"
    exit 0
  fi
  R=$GPU_CHECK_RANKS
  echo "gpu_check: dry run on $R CPU rank(s) (gloo): no CUDA device visible; torch $TORCH_VERSION"
else
  R=1
  for r in 8 4 2; do if [ "$N" -ge "$r" ]; then R=$r; break; fi; done
  NAMES=$("$PY" -c 'import torch; print(", ".join(sorted({torch.cuda.get_device_name(i)
                                                  for i in range(torch.cuda.device_count())})))' 2>/dev/null)
  echo "gpu_check: $N GPU(s) ($NAMES), torch $TORCH_VERSION, CUDA $CUDA_VERSION; checks on $R rank(s)"
  # float8 matmuls (torch._scaled_mm) need compute capability 8.9 (Ada, Hopper) or above on every GPU used
  CAPS=$("$PY" -c "import torch; print(min(torch.cuda.get_device_capability(i) for i in range($R)))" 2>/dev/null)
  FP8_OK=$("$PY" -c "import torch; print(int(min(torch.cuda.get_device_capability(i) for i in range($R)) >= (8, 9)))" \
    2>/dev/null)
fi

LOGS=${GPU_CHECK_LOGS:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
mkdir -p "$LOGS"
echo "gpu_check: logs in $LOGS"
TR=("$TORCHRUN" --standalone --nproc-per-node "$R")
OK="check against the single-device model: OK"

run_check a1 "$OK" "${TR[@]}" -m tensorplay_edu.demo --steps 10
run_check a2 "$OK" "${TR[@]}" -m tensorplay_edu.demo --steps 10 --plan vanilla
if [ "$R" -ge 4 ]; then
  run_check a3 "$OK" "${TR[@]}" -m tensorplay_edu.demo --steps 10 --dp 2
else
  echo "SKIP ${WHAT[a3]} (needs 4 ranks or more, 2 x 2; $R here)"
fi
run_check b "check against single-process math: OK" "${TR[@]}" -m tensorplay_edu.demo --transitions

# c: the script's own verdict is its last "PASS host syncs:" / "FAIL host syncs:" line.
log="$LOGS/c.log"
start=$SECONDS
timeout -k 30 "$TIMEOUT" "${TR[@]}" benchmarks/gpu_sync_check.py >"$log" 2>&1
rc=$?
verdict=$(grep -E '^(PASS|FAIL) host syncs:' "$log" | tail -n 1)
if [ "$rc" -eq 0 ] && [ "${verdict:0:4}" = "PASS" ]; then
  echo "PASS ${WHAT[c]} on $R rank(s): ${verdict#PASS host syncs: } ($((SECONDS - start)) s)"
elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  fail c "timed out after $TIMEOUT s" "$log"
else
  fail c "exit status $rc: ${verdict:-no verdict line}" "$log"
fi

bench_line() {  # log: the last "... ms/step ..." line's ms and bytes, as "MS BYTES"
  local ms bytes
  ms=$(grep -oE '[0-9]+(\.[0-9]+)? ms/step' "$1" | tail -n 1 | cut -d' ' -f1)
  bytes=$(grep -oE 'gather\+scatter bytes/rank [0-9,]+' "$1" | tail -n 1 | awk '{ gsub(",", "", $3); print $3 }')
  echo "$ms ${bytes:-0}"
}

# One bench variant under torchrun (full plan, bf16, BENCH_CONFIG) into its log; when it fails or prints no
# ms/step line: the check's FAIL line with the reason, and status 1.
bench_run() {  # id, label, log, bench.py flags...
  local id=$1 label=$2 log=$3 rc why
  shift 3
  timeout -k 30 "$TIMEOUT" "${TR[@]}" benchmarks/bench.py --torchrun --plan full --config "$BENCH_CONFIG" \
    --dtype bfloat16 "$@" >"$log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ] && [ -n "$(bench_line "$log" | cut -d' ' -f1)" ]; then
    return 0
  fi
  why="exit status $rc"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then why="timed out after $TIMEOUT s"; fi
  if [ "$rc" -eq 0 ]; then why="exit status 0 but no ms/step line"; fi
  fail "$id" "$label: $why" "$log"
  return 1
}

# d: ms/step of each implementation, and the ratio (a measurement: no threshold).
declare -A MS
d_ok=1
for impl in ours torch; do
  log="$LOGS/d-$impl.log"
  if ! bench_run d "--impl $impl" "$log" --impl "$impl"; then
    d_ok=0
    break
  fi
  MS[$impl]=$(bench_line "$log" | cut -d' ' -f1)
done
if [ "$d_ok" -eq 1 ]; then
  ratio=$(awk -v a="${MS[ours]}" -v b="${MS[torch]}" 'BEGIN { printf "%.2f", a / b }')
  echo "PASS ${WHAT[d]} on $R rank(s), $BENCH_CONFIG config:" \
    "ours ${MS[ours]} ms/step, PyTorch ${MS[torch]} ms/step, ours/PyTorch $ratio"
fi

# d2: ours with the float8 model and styles against ours in bf16 (d's number when d measured it);
# a measurement, no threshold. Bytes: gather+scatter bytes per rank, float8 / bf16.
if [ "$N" -gt 0 ] && [ "${FP8_OK:-0}" != "1" ]; then
  echo "SKIP ${WHAT[d2]} (float8 matmuls need compute capability 8.9 or above; ${CAPS:-unknown} here)"
else
  start=$SECONDS
  d2_ok=1
  declare -A D2
  for variant in bf16 float8; do
    log="$LOGS/d2-$variant.log"
    if [ "$variant" = bf16 ] && [ -n "${MS[ours]:-}" ]; then
      log="$LOGS/d-ours.log"  # d measured it already
    else
      extra=()
      if [ "$variant" = float8 ]; then extra=(--float8); fi
      if ! bench_run d2 "ours $variant" "$log" --impl ours ${extra[@]+"${extra[@]}"}; then
        d2_ok=0
        break
      fi
    fi
    D2[$variant]=$(bench_line "$log")
  done
  if [ "$d2_ok" -eq 1 ]; then
    read -r ms8 bytes8 <<<"${D2[float8]}"
    read -r ms16 bytes16 <<<"${D2[bf16]}"
    ratio=$(awk -v a="$ms8" -v b="$ms16" 'BEGIN { printf "%.2f", a / b }')
    bratio=$(awk -v a="$bytes8" -v b="$bytes16" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
    echo "PASS ${WHAT[d2]} on $R rank(s), $BENCH_CONFIG config:" \
      "ours float8 $ms8 ms/step, ours bf16 $ms16 ms/step, float8/bf16 $ratio;" \
      "gather+scatter bytes/rank float8/bf16 $bratio ($((SECONDS - start)) s)"
  fi
fi

# d3: ours bf16 with async TP against ours bf16 synchronous (d's number when d measured it); a measurement,
# no threshold. bench.py raises (a FAIL here) if the async step moves other bytes than the synchronous one.
start=$SECONDS
d3_ok=1
declare -A D3
for variant in sync async; do
  log="$LOGS/d3-$variant.log"
  if [ "$variant" = sync ] && [ -n "${MS[ours]:-}" ]; then
    log="$LOGS/d-ours.log"  # d measured it already
  else
    extra=()
    if [ "$variant" = async ]; then extra=(--async-tp); fi
    if ! bench_run d3 "ours $variant" "$log" --impl ours ${extra[@]+"${extra[@]}"}; then
      d3_ok=0
      break
    fi
  fi
  D3[$variant]=$(bench_line "$log")
done
if [ "$d3_ok" -eq 1 ]; then
  read -r msa _ <<<"${D3[async]}"
  read -r mss _ <<<"${D3[sync]}"
  ratio=$(awk -v a="$msa" -v b="$mss" 'BEGIN { printf "%.2f", a / b }')
  echo "PASS ${WHAT[d3]} on $R rank(s), $BENCH_CONFIG config:" \
    "ours async $msa ms/step, ours sync $mss ms/step, async/sync $ratio; same bytes ($((SECONDS - start)) s)"
fi

exit "$FAILED"
