#!/bin/bash
# The GPU run on a machine without network whose python3 already has a CUDA torch
# (not necessarily 2.13): the workplace's lent H100/H200 machines, say.
#
#   here, where pip works:   tools/gpu_lent_machine.sh fetch [TORCH_MINOR]
#   there, from a checkout:  tools/gpu_lent_machine.sh run [pytest args...]
#                            or its steps: build; test [pytest args...]; bench
#                            (test's arguments replace its default: tests)
#
# fetch downloads into wheels-lent/ the pure-Python and CPU wheels matching that torch
# (default 2.11: torchrec 1.6.1, fbgemm-gpu-cpu 1.6.0; fbgemm's CUDA wheel is 465 MB and
# does not travel, so TorchRec's GPU kernels, DMP on cuda and the fbgemm peers are
# absent). build installs them into /tmp/site and builds dynemb with DYNEMB_WITH_CUDA=1
# for this GPU only (a warm machine keeps both for the next command); test checks the
# link (tests/test_extension_build.py) and runs the suite with the cuda test device
# (DYNEMB_TEST_CUDA=1) on all cores, capped at TEST_SECONDS; bench runs the table
# benchmark, the table-op profile and the training profile (profile_train_gpu.py,
# W-train and W-train-wide) on the GPU, each capped at BENCH_SECONDS. Output under
# ${OUT:-gpu-out}/. Tests that need TorchRec 1.8's internals fail against torchrec
# 1.6.1; they are the CPU suite's.
set -o pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
case "${1:-}" in
fetch)
  minor=${2:-11}
  declare -A pins=([11]="fbgemm-gpu-cpu==1.6.0 torchrec==1.6.1" [13]="fbgemm-gpu-cpu==1.8.0 torchrec==1.8.0")
  [ -n "${pins[$minor]:-}" ] || { echo "no pins for torch 2.$minor" >&2; exit 2; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    -d wheels-lent ${pins[$minor]} tensordict==0.15.3 iopath==0.1.9 "pyvers>=0.2,<0.3"
  ls -la wheels-lent ;;
build)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    wheels-lent/*.whl || exit 1
  arch=$(python3 -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())') || exit 1
  nvidia-smi -L; nvcc --version | tail -1
  start=$(date +%s)
  DYNEMB_WITH_CUDA=1 TORCH_CUDA_ARCH_LIST=$arch MAX_JOBS=$(nproc) python3 setup.py -q build_ext \
    --inplace > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  echo "built for sm_$arch in $(( $(date +%s) - start )) s"
  python3 -c 'import dynemb; print("executor:", dynemb.executor())' ;;
test)
  shift
  # -v: one line per test, so that a run cut short by the cap still says what passed.
  DYNEMB_TEST_CUDA=1 timeout "${TEST_SECONDS:-1800}" python3 -m pytest -v -n "$(nproc)" \
    --timeout=120 -rfE --continue-on-collection-errors -p no:cacheprovider -p no:benchmark \
    "${@:-tests}" > "$out/tests.log" 2>&1
  echo "pytest exit $? ($(grep -c ' PASSED ' "$out/tests.log") PASSED lines)"
  grep -E " (FAILED|ERROR) " "$out/tests.log" | head -60
  tail -3 "$out/tests.log" ;;
bench)
  cap=${BENCH_SECONDS:-180}
  timeout "$cap" python3 benchmark/bench_table.py --device cuda --only table --repeats 3 \
    --out /tmp/plots > "$out/bench_table.jsonl"
  cat "$out/bench_table.jsonl"
  timeout "$cap" python3 benchmark/profile_table_ops.py --device cuda > "$out/profile_table_ops.txt"
  for w in train wide; do
    timeout "$cap" python3 benchmark/profile_train_gpu.py --device cuda --workload $w \
      --out "$out" 2>/dev/null
  done ;;
run)
  shift
  bash "$0" build && bash "$0" test tests "$@" && bash "$0" bench ;;
*)
  echo "usage: $0 fetch [TORCH_MINOR] | build | test [pytest args...] | bench | run [pytest args...]" >&2
  exit 2 ;;
esac
