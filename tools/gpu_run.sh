#!/bin/bash
# dynemb on an offline CUDA machine with a CUDA build of torch (2.11 or later will do: the
# CUDA executor needs no TorchRec 1.8), nvcc and pytest: one command, at most 7 minutes.
#
#   where pip works, once:  tools/gpu_run.sh fetch [TORCH_MINOR]   (fills wheels-offline/)
#   there, in a checkout:   tools/gpu_run.sh all
#                           or one step: build | test [pytest args...] | bench
#   anywhere, no GPU:       tools/gpu_run.sh dry [pytest args...]  (test and bench on the
#                           CPU at --quick sizes: checks this script; TEST_WORKERS=1: no -n)
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
#
# Each step runs under `timeout`; the caps (seconds) add up to 410 for `all`:
# BUILD_SECONDS 150, TEST_SECONDS 110, HKV_SECONDS 90, TRAIN_SECONDS 30 per workload
# (a step over its cap is stopped, 2 s later killed).
# Output in ${OUT:-gpu-out}/ (7 files): steps.jsonl (one line a step: exit status, seconds,
# cap), tests.jsonl (one line a test), bench_hkv.jsonl, train.jsonl (JSON lines), and
# build.log, tests.log, bench.log (the benchmarks' tables and profiles).
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
  tests/tbe/test_torch_rowwise_adagrad.py
)
# Those that compare with fbgemm's CPU kernels (tests/fbgemm_reference.py), when it imports.
FBGEMM_TESTS=(tests/tbe/test_batched_tables_reference.py tests/tbe/test_batched_tables_vs_fbgemm.py)

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
_build | _test)  # the steps' bodies, run under `capped`
  "$@" ;;
*)
  echo "usage: $0 fetch [TORCH_MINOR] | build | test [pytest args...] | bench | all" \
    "| dry [pytest args...]" >&2
  exit 2 ;;
esac
