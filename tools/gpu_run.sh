#!/bin/bash
# dynemb on an offline CUDA machine with a CUDA build of torch (2.11 or later will do: the
# CUDA executor needs no TorchRec 1.8), nvcc and pytest: one command, at most 7 minutes.
#
#   where pip works, once:  tools/gpu_run.sh fetch [TORCH_MINOR]   (fills wheels-offline/)
#   there, in a checkout:   tools/gpu_run.sh all
#                           or one step: build | test [pytest args...] | bench
#                           after build:  tools/gpu_run.sh sanitize   (not part of `all`)
#   anywhere, no GPU:       tools/gpu_run.sh dry [pytest args...]  (test and bench on the
#                           CPU at --quick sizes: checks this script; TEST_WORKERS=1: no -n)
#                           tools/gpu_run.sh dry-sanitize  (the sanitize step on the CPU)
#
# fetch  downloads into wheels-offline/ the pure-Python and CPU wheels that match that torch
#        (default 2.11: torchrec 1.6.1, fbgemm-gpu-cpu 1.6.0; fbgemm's CUDA wheel is 465 MB
#        and stays behind, so TorchRec's GPU kernels and the fbgemm GPU peers are absent).
# build  installs them into build/offline-site (when the machine's Python lacks torchrec)
#        and builds dynemb with DYNEMB_WITH_CUDA=1 for the GPU present only (~50 s on 16
#        cores; setup.py links the shared libstdc++ that torch runs on).
# test   the executor-parity tests and the tests that take the `device` fixture, on cpu
#        and cuda (DYNEMB_TEST_CUDA=1), on every core: GPU_TESTS below, plus the fbgemm
#        reference tests when fbgemm_gpu imports; arguments replace that list.
# bench  benchmark/bench_table.py --only hkv (HierarchicalKV's configurations beside the
#        same-run torch.index_select) and benchmark/profile_train_gpu.py for W-train and
#        W-train-wide (beside nn.EmbeddingBag + the same row-wise Adagrad in torch ops).
# sanitize  NVIDIA compute-sanitizer's memcheck, synccheck and initcheck (--error-exitcode 1),
#        one after another, each over SANITIZE_TESTS below (in one pytest process, on cpu and
#        cuda, the CUDA caching allocator off so that each tensor is an allocation of its own);
#        arguments replace that list. compute-sanitizer is looked for on PATH, then beside
#        nvcc, in $CUDA_HOME/bin and /usr/local/cuda/bin (SANITIZER=path overrides); where
#        none is found, or dynemb is not built with CUDA, the step says so and exits 2.
#        dry-sanitize runs the same step on the CPU (cpu only, the CPU build): it checks
#        the step's plumbing where there is no GPU.
#
# Each step runs under `timeout`; the caps (seconds) add up to 410 for `all`:
# BUILD_SECONDS 150, TEST_SECONDS 110, HKV_SECONDS 90, TRAIN_SECONDS 30 per workload
# (a step over its cap is stopped, 2 s later killed). `sanitize` has its own,
# SANITIZE_SECONDS 180, a third for each tool's step.
# Output in ${OUT:-gpu-out}/ (7 files, 8 with sanitize.log): steps.jsonl (one line a step:
# exit status, seconds, cap; the sanitize steps are sanitize_memcheck, sanitize_synccheck
# and sanitize_initcheck), tests.jsonl (one line a test), bench_hkv.jsonl, train.jsonl
# (JSON lines), and build.log, tests.log, bench.log (the benchmarks' tables and profiles),
# sanitize.log (each tool's pytest output and compute-sanitizer's report).
set -o pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$self")/.."
out=${OUT:-gpu-out}
site=build/offline-site
wheels=wheels-offline
device=${GPU_RUN_DEVICE:-cuda}  # `dry` sets cpu
workers=${TEST_WORKERS:-$(nproc)}
mkdir -p "$out"
exec 3>&1  # the terminal, for `capped`'s line when a step's output goes to a file
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/$site:$PWD
# Test files that run on the GPU and need neither TorchRec 1.8's internals nor fbgemm's
# CUDA kernels.
GPU_TESTS=(
  tests/csrc/test_extension_build.py tests/test_devices.py tests/csrc/test_executor_selection.py
  tests/csrc/test_executor_parity.py tests/table/test_table_placement.py tests/table/test_hash_keys.py
  tests/table/test_lfu_saturation.py tests/table/test_table_restore.py tests/tbe/test_grouped_lookup.py
  tests/tbe/test_torch_rowwise_adagrad.py tests/tiering/test_prefetch_streams.py
)
# Those that compare with fbgemm's CPU kernels (tests/fbgemm_reference.py), when it imports.
FBGEMM_TESTS=(tests/tbe/test_batched_tables_reference.py tests/tbe/test_batched_tables_vs_fbgemm.py)
# The sanitize step's subset of GPU_TESTS (72 tests on a GPU): every kind of table and
# embedding kernel (upsert with eviction and tiers, pins, erase, rehash, restore,
# de-duplication, pooling, gather, backward and each optimizer, cache exchange; hashing;
# the grouped lookup of a training module), every dtype instantiation, at one CPU thread
# and sum pooling only (mean runs the same kernels), so that each tool's run fits its
# third of SANITIZE_SECONDS.
SANITIZE_TESTS=(
  tests/csrc/test_executor_parity.py tests/table/test_hash_keys.py::test_edge_keys
  tests/tbe/test_grouped_lookup.py::test_a_module_trains_as_with_a_lookup_per_table
  -k "not cpu-2-threads and not mean"
)
SANITIZE_TOOLS=(memcheck synccheck initcheck)

# capped NAME SECONDS COMMAND...: runs COMMAND under `timeout` (which stops its whole
# process group, pytest's workers too), appends its line to steps.jsonl and returns its
# exit status (124: stopped at the cap).
capped() {
  local name=$1 cap=$2 start rc ms
  shift 2
  start=$(date +%s%N)
  timeout -k 2 "$cap" "$@"
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  printf '{"step": "%s", "exit": %d, "seconds": %d.%03d, "cap": %d}\n' "$name" "$rc" \
    $((ms / 1000)) $((ms % 1000)) "$cap" >> "$out/steps.jsonl"
  echo "== $name: exit $rc$([ "$rc" = 124 ] && echo " (stopped at its ${cap} s cap)")" >&3
  return "$rc"
}

has() { python3 -c "import $1" 2>/dev/null; }

_build() {
  if ! has torchrec; then
    ls "$wheels"/*.whl >/dev/null 2>&1 || {
      echo "no torchrec here and no $wheels/: run 'tools/gpu_run.sh fetch' where pip works" >&2
      return 2
    }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "$wheels"/*.whl || return 1
  fi
  local arch
  arch=$(python3 -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())' \
    2>/dev/null) || {
    echo "torch sees no GPU: $(python3 -c 'import torch; print(torch.__version__)')" >&2
    return 2
  }
  command -v nvcc >/dev/null || { echo "nvcc not found on PATH" >&2; return 2; }
  nvidia-smi -L
  echo "torch $(python3 -c 'import torch; print(torch.__version__)'), $(nvcc --version | tail -1)"
  DYNEMB_WITH_CUDA=1 TORCH_CUDA_ARCH_LIST=$arch MAX_JOBS=$(nproc) python3 setup.py -q \
    build_ext --inplace > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; return 1; }
  python3 -c 'import dynemb; print("built for sm_'"$arch"'; executor:", dynemb.executor())'
}

_test() {
  local files=("$@") args=(-v -rfE -p no:cacheprovider -p no:benchmark)
  if [ ${#files[@]} -eq 0 ]; then
    files=("${GPU_TESTS[@]}")
    has tests.fbgemm_reference && files+=("${FBGEMM_TESTS[@]}")
  fi
  # -v: one line a test, so that a run stopped by its cap still says what passed.
  [ "$workers" -gt 1 ] && has xdist && args+=(-n "$workers")
  has pytest_timeout && args+=(--timeout=120)
  DYNEMB_TEST_CUDA=$([ "$device" = cuda ] && echo 1 || echo 0) python3 -m pytest "${args[@]}" \
    --junitxml=build/gpu-tests.xml "${files[@]}" > "$out/tests.log" 2>&1
}

step_test() {
  rm -f build/gpu-tests.xml
  capped test "${TEST_SECONDS:-110}" bash "$self" _test "$@"
  local rc=$?
  python3 tools/junit_jsonl.py build/gpu-tests.xml "$out/tests.log" > "$out/tests.jsonl"
  grep -E " (FAILED|ERROR) " "$out/tests.log" | head -40
  tail -1 "$out/tests.jsonl"
  return "$rc"
}

step_bench() {
  local rc=0 w quick=()
  [ "$device" = cpu ] && quick=(--quick)
  capped bench_hkv "${HKV_SECONDS:-90}" python3 benchmark/bench_table.py --device "$device" \
    --only hkv "${quick[@]}" > "$out/bench_hkv.jsonl" 2>> "$out/bench.log" || rc=1
  for w in train wide; do
    capped "train_$w" "${TRAIN_SECONDS:-30}" python3 benchmark/profile_train_gpu.py \
      --device "$device" --workload "$w" "${quick[@]}" --out build/gpu-profiles \
      >> "$out/train.jsonl" 2>> "$out/bench.log" || rc=1
  done
  cat "$out/bench_hkv.jsonl" "$out/train.jsonl" | grep -c . | sed 's/$/ JSON lines/'
  return "$rc"
}

# The compute-sanitizer to run: SANITIZER when set, else the first found on PATH, beside
# nvcc (where it is a link into the toolkit), in $CUDA_HOME/bin, in /usr/local/cuda/bin.
sanitizer() {
  local c nvcc
  if [ -n "${SANITIZER:-}" ]; then
    [ -x "$SANITIZER" ] && echo "$SANITIZER"
    return
  fi
  nvcc=$(command -v nvcc) && nvcc=$(readlink -f "$nvcc")
  for c in "$(command -v compute-sanitizer)" "${nvcc:+$(dirname "$nvcc")/compute-sanitizer}" \
      "${CUDA_HOME:+$CUDA_HOME/bin/compute-sanitizer}" /usr/local/cuda/bin/compute-sanitizer; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}

# _sanitize TOOL [pytest args...]: one tool's run, its output appended to sanitize.log.
_sanitize() {
  local tool=$1 cs args=(-v -rfE -p no:cacheprovider -p no:benchmark -p no:xdist)
  shift
  local files=("$@")
  [ ${#files[@]} -eq 0 ] && files=("${SANITIZE_TESTS[@]}")
  {
    echo "== $tool: $(date -u +%FT%TZ)"
    cs=$(sanitizer) || {
      echo "compute-sanitizer not found (SANITIZER, PATH, beside nvcc, \$CUDA_HOME/bin," \
        "/usr/local/cuda/bin): install the CUDA toolkit's compute-sanitizer or set SANITIZER"
      return 2
    }
    if [ "$device" = cuda ] && ! python3 -c 'import sys, dynemb._C as C, torch
sys.exit(not (C.with_cuda and torch.cuda.is_available()))' 2>/dev/null; then
      echo "dynemb is not built with CUDA or torch sees no GPU: run 'tools/gpu_run.sh build' first"
      return 2
    fi
    printf '%q ' "$cs" --tool "$tool" --error-exitcode 1 python3 -m pytest "${args[@]}" "${files[@]}"
    echo
    DYNEMB_TEST_CUDA=$([ "$device" = cuda ] && echo 1 || echo 0) \
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$cs" --tool "$tool" --error-exitcode 1 \
      python3 -m pytest "${args[@]}" "${files[@]}"
  } >> "$out/sanitize.log" 2>&1
}

step_sanitize() {
  local rc=0 tool cap=$(( ${SANITIZE_SECONDS:-180} / ${#SANITIZE_TOOLS[@]} ))
  rm -f "$out/sanitize.log"
  for tool in "${SANITIZE_TOOLS[@]}"; do
    capped "sanitize_$tool" "$cap" bash "$self" _sanitize "$tool" "$@" || rc=1
    # What this tool's run said: a missing prerequisite, or the failures, the tests'
    # summary and the sanitizer's error count; else (pytest never got to its summary)
    # the run's last lines.
    awk -v head="== $tool:" '
      index($0, head) == 1 { n = 0; said = "" }
      { last[++n] = $0 }
      /^(compute-sanitizer not found|dynemb is not built)|ERROR SUMMARY|^(FAILED|ERROR) / ||
      /^=+ .* in [0-9.]+s/ { if (++m <= 20) said = said $0 "\n" }
      /^=+ .* in [0-9.]+s|^(compute-sanitizer not found|dynemb is not built)/ { done = 1 }
      END { if (done) printf "%s", said; else for (i = (n > 8 ? n - 7 : 1); i <= n; i++) print last[i] }
    ' "$out/sanitize.log"
  done
  return "$rc"
}

case "${1:-}" in
fetch)
  minor=${2:-11}
  declare -A pins=([11]="fbgemm-gpu-cpu==1.6.0 torchrec==1.6.1"
                   [13]="fbgemm-gpu-cpu==1.8.0 torchrec==1.8.0")
  [ -n "${pins[$minor]:-}" ] || { echo "no pins for torch 2.$minor" >&2; exit 2; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$wheels" ${pins[$minor]} tensordict==0.15.3 iopath==0.1.9 "pyvers>=0.2,<0.3"
  ls -la "$wheels" ;;
build)
  capped build "${BUILD_SECONDS:-150}" bash "$self" _build ;;
test)
  shift
  step_test "$@" ;;
bench)
  step_bench ;;
all)
  rm -f "$out/steps.jsonl" "$out/train.jsonl" "$out/bench.log"
  capped build "${BUILD_SECONDS:-150}" bash "$self" _build || { cat "$out/steps.jsonl"; exit 1; }
  step_test; rc=$?
  step_bench || rc=1
  cat "$out/steps.jsonl"
  exit "$rc" ;;
dry)  # test and bench on the CPU at --quick sizes: checks this script without a GPU
  shift
  export GPU_RUN_DEVICE=cpu
  device=cpu
  rm -f "$out/steps.jsonl" "$out/train.jsonl" "$out/bench.log"
  step_test "$@"; rc=$?
  step_bench || rc=1
  cat "$out/steps.jsonl"
  exit "$rc" ;;
sanitize | dry-sanitize)  # not part of `all`: after `build`, a step of its own; dry- runs
  # it on the CPU (the cpu device, the CPU build), which checks its plumbing without a GPU
  [ "$1" = dry-sanitize ] && { export GPU_RUN_DEVICE=cpu; device=cpu; }
  shift
  step_sanitize "$@"; rc=$?
  grep '"step": "sanitize_' "$out/steps.jsonl"
  exit "$rc" ;;
_build | _test | _sanitize)  # the steps' bodies, run under `capped`
  "$@" ;;
*)
  echo "usage: $0 fetch [TORCH_MINOR] | build | test [pytest args...] | bench | all" \
    "| sanitize [pytest args...] | dry [pytest args...] | dry-sanitize [pytest args...]" >&2
  exit 2 ;;
esac
