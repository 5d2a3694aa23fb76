#!/usr/bin/env bash
# `make gpu-check`: the first command to run on a machine with GPUs.
#
# N = the GPUs torch sees (torch.cuda.device_count(); nvidia-smi only to notice a CPU build
# of torch on a GPU machine). The checks run on R ranks, one per GPU, R = the largest of
# 8, 4, 2, 1 not above N. Each line is a verdict: "PASS ...", "FAIL ..." (a check with a
# threshold), "MEASURED ..." (a measurement: no threshold, never PASS) or "SKIP ... (why)":
#   a1. the demo under torchrun, full plan, float64, 10 steps: "check against the single-device model: OK"
#   a2. the same with --plan vanilla
#   a3. the same with --dp 2 (PyTorch's DDP over two TP groups), when R >= 4
#   b.  the transition table under torchrun (-m tensorplay_edu.lab.demo --transitions)
#   c.  no host synchronisation in a training step (bf16 vanilla and full, float8, async TP, AdamW's
#       step): benchmarks/gpu_sync_check.py (a TorchDispatchMode, torch.cuda.set_sync_debug_mode)
#   d1-d5. MEASURED, the GPU-sized model (benchmarks/gpu_model.py: dim 4096, 32 / 8 heads, FFN 14336,
#       4 layers, 8192 tokens, bf16, full plan; ours with the norms' gradients in one bucket, as make
#       bench): tokens/s, MFU and peak memory per GPU of ours (d1),
#       ours float8 (d2), ours async TP (d3), PyTorch's TP (d4), the hand-written floor (d5)
#   e1-e3. PASS / FAIL, the same model, the losses of 5 AdamW steps within a stated tolerance:
#       ours vs PyTorch's TP in bf16 (e1), float8 TP vs the float8 model on one GPU (e2), async vs
#       sync TP (e3); every loss finite; e2 also within 0.1 of e1's bf16 losses, falling, and SKIPs
#       on a GPU too small for the one-GPU reference
# d2 and e2 SKIP on GPUs below compute capability 8.9 (no float8 matmuls in torch._scaled_mm).
#
# Every check starts through benchmarks/gpu_run.py, which prints where it ran ("nccl on 8 cuda
# rank(s)", in each verdict line) and, on a GPU machine, REQUIRES nccl and a CUDA device per rank
# (a fallback to gloo on the CPU is a FAIL) and, except for the timed d lines, every collective on
# CUDA. Collectives time out after GPU_CHECK_NCCL_TIMEOUT s (default 180, below the per-check kill
# GPU_CHECK_TIMEOUT, default 600 s) with NCCL's flight recorder on: on a hang the watchdog dumps each
# rank's last collectives to $LOGS/fr-<launch>-<rank> (launches a1, a2, a3, b, c, d, e), and the FAIL
# line names them and the command that reads them (python -m torch.distributed.flight_recorder.fr_trace
# $LOGS --prefix fr-<launch>-). Past GPU_CHECK_TIMEOUT the launch gets SIGTERM, 90 s, then SIGKILL for it and
# every process below it, ranks included (GPU_CHECK_TIMEOUT is at least 2 s, the collective timeout 1 s).
# The exit status is 1 if any check FAILs, else 0; the script goes on after a failure; a FAIL
# line names its log and the log's last lines follow it, indented. Logs: GPU_CHECK_LOGS
# (default a fresh folder under /tmp).
#
# No CUDA device visible (a laptop, CI): every line prints "SKIP ... (no CUDA device visible)" and
# the exit status is 0.
#
# Knobs: GPU_CHECK_RANKS=2 runs the checks on 2 CPU ranks (gloo) where no CUDA device is visible,
# a dry run of this script itself, with the tiny model (GPU_CHECK_CONFIG: gpu or tiny);
# GPU_CHECK_STEPS timed steps per measurement (default 10 after 2 warm-up steps; 1 and none in a
# dry run); GPU_CHECK_ONLY="a1 c d e" runs only those checks (d and e: all their lines), the others
# SKIP; VENV (default .venv) holds python and torchrun.

set -u
cd "$(dirname "$0")/.." || exit 2
VENV=${VENV:-.venv}
PY=$VENV/bin/python
TORCHRUN=$VENV/bin/torchrun
TIMEOUT=${GPU_CHECK_TIMEOUT:-600}
if [ "$TIMEOUT" -lt 2 ]; then TIMEOUT=2; fi  # the collective timeout below it must stay a positive number
NCCL_TIMEOUT=${GPU_CHECK_NCCL_TIMEOUT:-180}
if [ "$NCCL_TIMEOUT" -ge "$TIMEOUT" ]; then NCCL_TIMEOUT=$((TIMEOUT / 2)); fi
if [ "$NCCL_TIMEOUT" -lt 1 ]; then NCCL_TIMEOUT=1; fi
FAILED=0

IDS=(a1 a2 a3 b c d1 d2 d3 d4 d5 e1 e2 e3)
declare -A WHAT=(
  [a1]="a1. demo, full plan, float64, under torchrun"
  [a2]="a2. demo, vanilla plan, float64, under torchrun"
  [a3]="a3. demo, DP x TP (--dp 2), under torchrun"
  [b]="b. transition table (demo --transitions) under torchrun"
  [c]="c. host syncs in a training step, bf16, float8, async TP, AdamW (gpu_sync_check.py)"
  [d1]="d1. bf16 step, full plan, ours: tokens/s, MFU, memory (gpu_measure.py)"
  [d2]="d2. float8 step, full plan, ours float8: tokens/s, MFU, memory (gpu_measure.py)"
  [d3]="d3. bf16 step, full plan, ours async TP: tokens/s, MFU, memory (gpu_measure.py)"
  [d4]="d4. bf16 step, full plan, PyTorch's TP: tokens/s, MFU, memory (gpu_measure.py)"
  [d5]="d5. bf16 step, full plan, hand-written floor: tokens/s, MFU, memory (gpu_measure.py)"
  [e1]="e1. bf16 losses, ours vs PyTorch's TP (gpu_measure.py)"
  [e2]="e2. float8 losses, float8 TP vs the float8 model on one GPU (gpu_measure.py)"
  [e3]="e3. bf16 losses, async TP vs synchronous TP (gpu_measure.py)"
)

skip_all() {  # every check: SKIP (why)
  for id in "${IDS[@]}"; do echo "SKIP ${WHAT[$id]} ($1)"; done
}

# fail ID WHY LOG: the verdict (with the flight recorder's dumps, if any), then the log's last lines
fail() {
  local dumps
  dumps=$(ls "$LOGS/fr-$(basename "$3" .log)-"* 2>/dev/null | tr '\n' ' ')  # the launch's, as launch() names them
  if [ -n "$dumps" ]; then
    dumps="; NCCL flight recorder dumps: ${dumps% } (read them with: $PY -m torch.distributed.flight_recorder.fr_trace"
    dumps+=" $LOGS --prefix fr-$(basename "$3" .log)-)"
  fi
  echo "FAIL ${WHAT[$1]}: $2 (log: $3$dumps)"
  grep -v -e '^W[0-9]' -e '^\*\*\*' -e 'OMP_NUM_THREADS' "$3" 2>/dev/null | tail -n 12 | sed 's/^/    | /'
  FAILED=1
}

why_not() {  # rc: the reason a launch failed
  if [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; then echo "timed out after $TIMEOUT s"; else echo "exit status $1"; fi
}

where() {  # log: gpu_run.py's "ran on" summary, e.g. "nccl on 8 cuda rank(s)"
  sed -n "s/^gpu_run: ran on: \(.*\) (backend .*/\1/p" "$1" | head -n 1 | sed 's/ *$//'
}

children_of() {  # pid: its children, from /proc/*/stat (the parent is the 2nd field after the ") " of the name)
  local stat line rest
  for stat in /proc/[0-9]*/stat; do
    { read -r line <"$stat"; } 2>/dev/null || continue
    rest=${line##*) }
    rest=${rest#* }
    if [ "${rest%% *}" = "$1" ]; then stat=${stat#/proc/}; echo "${stat%/stat}"; fi
  done
}

descendants() {  # pid: every process below it (torchrun's ranks live in new sessions: a group kill misses them)
  local kid
  for kid in $(children_of "$1"); do
    echo "$kid"
    descendants "$kid"
  done
}

# launch ID PROGRAM...: torchrun through gpu_run.py into $LOGS/ID.log, with the flight recorder on; sets RC
# (124 past the per-check kill). Past $TIMEOUT s: the launch's process tree is noted while it is whole, torchrun
# gets SIGTERM and 90 s (more than its own 30 s to stop its workers), then everything noted, torchrun included,
# gets SIGKILL: a hung rank (in its own session, out of reach of a group kill) cannot keep a GPU for later checks.
launch() {
  local id=$1 pid tree deadline
  shift
  env GPU_CHECK_NCCL_TIMEOUT="$NCCL_TIMEOUT" TORCH_NCCL_DUMP_ON_TIMEOUT=1 "$FR_SIZE=2000" "$FR_FILE=$LOGS/fr-$id-" \
    "$TORCHRUN" --standalone --nproc-per-node "$R" benchmarks/gpu_run.py "$@" >"$LOGS/$id.log" 2>&1 &
  pid=$!
  deadline=$((SECONDS + TIMEOUT))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.5; done
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid"
    RC=$?
    return
  fi
  tree=$(descendants "$pid")
  kill -TERM "$pid" 2>/dev/null
  deadline=$((SECONDS + 90))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.5; done
  tree="$tree $(descendants "$pid")"
  # shellcheck disable=SC2086  # one pid per word
  kill -KILL "$pid" $tree 2>/dev/null
  wait "$pid" 2>/dev/null
  echo "gpu_check: killed after $TIMEOUT s: torchrun (pid $pid) and what was below it:" $tree >>"$LOGS/$id.log"
  RC=124
}

chosen() {  # id: is it in GPU_CHECK_ONLY (or is that unset)? d1..d5 go with "d", e1..e3 with "e"
  [ -z "${GPU_CHECK_ONLY:-}" ] && return 0
  [[ " $GPU_CHECK_ONLY " == *" $1 "* || " $GPU_CHECK_ONLY " == *" ${1:0:1} "* ]]
}

# run_check ID WANT PROGRAM...: PASS when the launch exits 0 within the timeout and its output has the line WANT.
run_check() {
  local id=$1 want=$2 log="$LOGS/$1.log" start=$SECONDS
  shift 2
  if ! chosen "$id"; then echo "SKIP ${WHAT[$id]} (not in GPU_CHECK_ONLY)"; return; fi
  launch "$id" "$@"
  if [ "$RC" -ne 0 ]; then
    fail "$id" "$(why_not "$RC")" "$log"
  elif ! grep -qF -- "$want" "$log"; then
    fail "$id" "exit status 0 but no line \"$want\"" "$log"
  else
    echo "PASS ${WHAT[$id]} on $(where "$log"): $want ($((SECONDS - start)) s)"
  fi
}

# run_lines GROUP IDS PROGRAM...: one launch whose rank 0 prints a verdict line per id ("MEASURED d1. ...",
# "PASS e1. ...", "FAIL ...", "SKIP ..."): each is passed on; an id with no line is a FAIL with the reason.
run_lines() {
  local group=$1 ids=$2 log="$LOGS/$1.log" id line missing=0
  shift 2
  if ! chosen "$group"; then
    for id in $ids; do echo "SKIP ${WHAT[$id]} (not in GPU_CHECK_ONLY)"; done
    return
  fi
  launch "$group" "$@"
  for id in $ids; do
    line=$(grep -E "^(MEASURED|PASS|FAIL|SKIP) $id\. " "$log" | tail -n 1)
    if [ -z "$line" ]; then
      missing=1
      fail "$id" "no verdict line: $(why_not "$RC")" "$log"
    else
      echo "$line"
      if [ "${line:0:4}" = "FAIL" ]; then FAILED=1; fi
    fi
  done
  if [ "$RC" -ne 0 ] && [ "$missing" -eq 0 ] && ! grep -qE "^FAIL $group[0-9]\. " "$log"; then
    # every line printed, yet the launch failed: gpu_run.py's device requirement, or a rank's ending
    echo "FAIL ${group}. the launch of ${ids// /, }: $(why_not "$RC") after its lines (log: $log)"
    grep -E '^gpu_run: ' "$log" | sed 's/^/    | /'
    FAILED=1
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
FP8_SKIP=""
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
  CONFIG=${GPU_CHECK_CONFIG:-tiny}
  STEPS=${GPU_CHECK_STEPS:-1}
  WARMUP=0  # the code path, not a number: no warm-up steps beyond the first
  unset GPU_CHECK_DEVICE  # a dry run: gloo on the CPU is expected
  echo "gpu_check: dry run on $R CPU rank(s) (gloo): no CUDA device visible; torch $TORCH_VERSION; $CONFIG model"
else
  R=1
  for r in 8 4 2; do if [ "$N" -ge "$r" ]; then R=$r; break; fi; done
  CONFIG=${GPU_CHECK_CONFIG:-gpu}
  STEPS=${GPU_CHECK_STEPS:-10}
  WARMUP=2
  export GPU_CHECK_DEVICE=cuda  # gpu_run.py: nccl and a CUDA device per rank, or FAIL
  NAMES=$("$PY" -c 'import torch; print(", ".join(sorted({torch.cuda.get_device_name(i)
                                                  for i in range(torch.cuda.device_count())})))' 2>/dev/null)
  echo "gpu_check: $N GPU(s) ($NAMES), torch $TORCH_VERSION, CUDA $CUDA_VERSION; checks on $R rank(s)"
  # float8 matmuls (torch._scaled_mm) need compute capability 8.9 (Ada, Hopper) or above on every GPU used
  CAPS=$("$PY" -c "import torch; print(min(torch.cuda.get_device_capability(i) for i in range($R)))" 2>/dev/null)
  FP8_OK=$("$PY" -c "import torch; print(int(min(torch.cuda.get_device_capability(i) for i in range($R)) >= (8, 9)))" \
    2>/dev/null)
  if [ "$FP8_OK" != "1" ]; then
    FP8_SKIP="float8 matmuls need compute capability 8.9 or above; ${CAPS:-unknown} here"
  fi
fi

# The flight recorder's knobs, as this torch spells them: TORCH_FR_BUFFER_SIZE / TORCH_FR_DUMP_TEMP_FILE where
# its library knows those names (the TORCH_NCCL_* ones then warn, deprecated), else TORCH_NCCL_TRACE_BUFFER_SIZE /
# TORCH_NCCL_DEBUG_INFO_TEMP_FILE. The dump lands in FR_FILE<rank>.
TORCH_LIB=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)
if grep -qa TORCH_FR_BUFFER_SIZE "$TORCH_LIB"/libtorch_cpu.* 2>/dev/null; then
  FR_SIZE=TORCH_FR_BUFFER_SIZE FR_FILE=TORCH_FR_DUMP_TEMP_FILE
else
  FR_SIZE=TORCH_NCCL_TRACE_BUFFER_SIZE FR_FILE=TORCH_NCCL_DEBUG_INFO_TEMP_FILE
fi

LOGS=${GPU_CHECK_LOGS:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
mkdir -p "$LOGS"
echo "gpu_check: logs in $LOGS; collective timeout $NCCL_TIMEOUT s, each check killed after $TIMEOUT s"
OK="check against the single-device model: OK"
MEASURE=(benchmarks/gpu_measure.py --config "$CONFIG" --steps "$STEPS" --warmup "$WARMUP" --skip-float8 "$FP8_SKIP")

run_check a1 "$OK" -m tensorplay_edu.lab.demo --steps 10
run_check a2 "$OK" -m tensorplay_edu.lab.demo --steps 10 --plan vanilla
if [ "$R" -ge 4 ]; then
  run_check a3 "$OK" -m tensorplay_edu.lab.demo --steps 10 --dp 2
else
  echo "SKIP ${WHAT[a3]} (needs 4 ranks or more, 2 x 2; $R here)"
fi
run_check b "check against single-process math: OK" -m tensorplay_edu.lab.demo --transitions

# c: the script's own verdict is its last "PASS host syncs:" / "FAIL host syncs:" line.
if chosen c; then
  start=$SECONDS
  launch c benchmarks/gpu_sync_check.py
  verdict=$(grep -E '^(PASS|FAIL) host syncs:' "$LOGS/c.log" | tail -n 1)
  if [ "$RC" -eq 0 ] && [ "${verdict:0:4}" = "PASS" ]; then
    echo "PASS ${WHAT[c]} on $(where "$LOGS/c.log"): ${verdict#PASS host syncs: } ($((SECONDS - start)) s)"
  else
    fail c "$(why_not "$RC"): ${verdict:-no verdict line}" "$LOGS/c.log"
  fi
else
  echo "SKIP ${WHAT[c]} (not in GPU_CHECK_ONLY)"
fi

# d: timed, so gpu_run.py's dispatch mode stays off (gpu_measure.py checks its tensors' device itself).
GPU_CHECK_WATCH=0 run_lines d "d1 d2 d3 d4 d5" "${MEASURE[@]}" --check d
run_lines e "e1 e2 e3" "${MEASURE[@]}" --check e

exit "$FAILED"
