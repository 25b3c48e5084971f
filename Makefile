# dynemb developer entry points. `make demo` and `make test` are the whole set-up:
# both create .venv on first use and build the C++ extension.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.deps-installed
NVCC   ?= $(shell command -v nvcc 2>/dev/null)
# cuda-check's CUDA build of torch: downloaded once per machine, outside .venv.
TORCH_CUDA_CACHE ?= $(HOME)/.cache/dynemb/torch-2.13.0-cu130-$(shell $(PYTHON) -c \
  'import sys; print("cp%d%d" % sys.version_info[:2])')

.PHONY: demo test ci-stages test-cpu test-emulated venv build cuda-check lint bench-quick \
  clean FORCE \
  sanitize sanitize-asan sanitize-tsan \
  venv-cuda wheels-cuda gpu-check gpu-test gpu-bench

$(STAMP): requirements.txt requirements-nodeps.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	touch $@

venv: $(STAMP)

# Rebuild the extension after any C++ edit (editable install, no build isolation, so
# it compiles against the venv's torch); a no-op when no C++ input changed. BUILD_INPUTS
# lists the inputs and DYNEMB_WITH_CUDA, and is rewritten only when that list changes
# (a file added or removed, the variable set), so the stamp also reacts to those.
EXT_STAMP    := build/.extension-built
BUILD_INPUTS := build/.extension-inputs
EXT_SOURCES  := $(sort $(shell find csrc -type f \( -name '*.h' -o -name '*.cuh' -o \
  -name '*.cpp' -o -name '*.cu' \))) setup.py pyproject.toml

build: $(EXT_STAMP)

$(EXT_STAMP): $(STAMP) $(BUILD_INPUTS) $(EXT_SOURCES) $(if $(wildcard dynemb/_C*.so),,FORCE)
	MAX_JOBS=2 $(PY) -m pip install -q --no-build-isolation --no-deps -e .
	@mkdir -p $(@D) && touch $@

$(BUILD_INPUTS): FORCE
	@mkdir -p $(@D)
	@echo "DYNEMB_WITH_CUDA=$(DYNEMB_WITH_CUDA) $(EXT_SOURCES)" > $@.tmp
	@if cmp -s $@.tmp $@; then rm $@.tmp; else mv $@.tmp $@; fi

FORCE:

# OMP_NUM_THREADS: one thread per rank (unless set), the value torchrun picks itself
# when it is unset, after a banner asking to set it.
demo: build
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(VENV)/bin/torchrun --nproc_per_node=2 example.py \
	  --train --eval

# Compiles and links the CUDA build of the extension (every source and flag of
# `DYNEMB_WITH_CUDA=1 pip install`) for sm_80 and sm_90 against torch 2.13.0+cu130, which
# it downloads into TORCH_CUDA_CACHE on first use (mk/cuda-check.mk); needs no .venv.
# Skipped (with the reason printed) on machines without nvcc.
# Under `make test` (a jobserver in MAKEFLAGS) it shares the CI_JOBS slots; alone, -j2.
SUBMAKE_JOBS = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j2)
cuda-check:
ifeq ($(NVCC),)
	@echo "cuda-check: skipped, nvcc not found on PATH"
else
	@$(MAKE) --no-print-directory $(SUBMAKE_JOBS) -f mk/cuda-check.mk PYTHON=$(PYTHON) \
	  NVCC=$(NVCC) TORCH_CUDA_CACHE=$(TORCH_CUDA_CACHE)
	@cat build/cuda-check/_C.so.checked
endif

# lint-imports: the import contracts of pyproject.toml ([tool.importlinter]).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

# The whole suite runs twice: on the CPU executor (test-cpu), then on the emulated CUDA
# executor (test-emulated: the csrc/cuda kernels built for the host; see
# DynamicEmb_APIs.md, "Executors"; tests marked no_emulated_pass are skipped there).
# pytest exits 5 when it collects no test: that is not a failure for us.
# TEST_WORKERS pytest-xdist processes share the tests out file by file (a module's
# fixtures are built once); 0 runs them in this process.
TEST_WORKERS ?= 2
PYTEST_WORKERS = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
# --durations: the slowest tests, named in every run's log, so test time is watched.
PYTEST = $(PY) -m pytest tests -q -x --timeout=600 --durations=15 $(PYTEST_WORKERS)

# `make test` runs CI's stages side by side, CI_JOBS at a time (make -j): one stage's
# idle core (pip, lint, a benchmark, a suite's last file) serves another; on 2 cores
# this saves minutes over one stage after another. Each stage's output is printed in
# one piece when it ends (--output-sync); the first failure stops the rest.
CI_JOBS ?= 2
test:
	@$(MAKE) --no-print-directory -j$(CI_JOBS) --output-sync=target ci-stages

ci-stages: build cuda-check lint bench-quick sanitize test-cpu test-emulated

test-cpu: build
	$(PYTEST) || [ $$? -eq 5 ]

test-emulated: build
	DYNEMB_EXECUTOR=cuda-emulated $(PYTEST) || [ $$? -eq 5 ]

# ---------------------------------------------------------------- sanitizers
# `make sanitize` (part of `make test`): sanitize-asan builds an ASan + UBSan copy of the
# extension into build/sanitize/site (setup.py, DYNEMB_SANITIZE=1; the normal build stays)
# and runs the table, kernel and checkpoint tests on it; sanitize-tsan builds and runs the
# torch-free ThreadSanitizer driver of the table algorithm (tests/native/tsan_tables.cpp),
# the lockstep primitives and the memory model's litmus kernels under TSan.
# Tests that spawn rank processes are skipped under ASan (slow); ASAN_SPAWNED=1 runs them.
SANITIZE_SITE  := build/sanitize/site
SANITIZE_STAMP := build/sanitize/.extension-built
TSAN_DRIVER    := build/sanitize/tsan/tsan_tables
ASAN_SPAWNED   ?=
# The tests that reach C++ (table, kernel and checkpoint ops); not those of Python-only
# code (dump locking, a full disk, split_by_table's tensor ops).
SANITIZE_PYTHON_ONLY := tests/checkpoint/test_checkpoint_concurrent_dumps.py \
  tests/checkpoint/test_checkpoint_failed_dump.py
SANITIZE_TESTS := $(filter-out $(SANITIZE_PYTHON_ONLY),$(sort $(wildcard tests/table/test_table*.py \
  tests/tbe/test_batched_tables*.py tests/checkpoint/test_checkpoint*.py \
  tests/checkpoint/test_dynamicemb_layout*.py tests/table/test_eviction*.py))) \
  tests/checkpoint/test_table_names_unique.py \
  tests/table/test_growth.py tests/table/test_bucket_overflow.py tests/table/test_hash_keys.py \
  tests/table/test_concurrency.py tests/csrc/test_executor_parity.py tests/csrc/test_op_argument_checks.py \
  tests/tiering/test_tiers.py tests/tiering/test_storage.py tests/table/test_value_dtypes.py \
  tests/table/test_initializers.py tests/tiering/test_cache_exchange.py tests/tiering/test_caching_checkpoint.py \
  tests/checkpoint/test_incremental_dump.py tests/table/test_large_outputs.py tests/tbe/test_grouped_ops.py \
  tests/csrc/test_unique_keys.py tests/tbe/test_bag_columns.py tests/tbe/test_grouped_lookup.py \
  tests/table/test_padded_claim.py tests/inference/test_quantized_rows.py \
  tests/table/test_restore_full_table.py
# PYTHONSAFEPATH and --import-mode=append: neither the working directory nor pytest's
# rootdir may come before the sanitized copy on sys.path (checked before the run).
# libstdc++ is preloaded with libasan: python is no C++ program, and ASan's __cxa_throw
# interceptor must find the real one at start-up (else the first C++ exception aborts).
# --capture=sys: a sanitizer's report goes to the terminal, not into pytest's capture.
# DYNEMB_EXPECT_EXTENSION_IN: tests/conftest.py checks the same in every xdist worker.
ASAN_ENV = PYTHONSAFEPATH=1 PYTHONPATH=$(SANITIZE_SITE):$(CURDIR) \
  LD_PRELOAD="$$($(CXX) -print-file-name=libasan.so) $$($(CXX) -print-file-name=libstdc++.so)" \
  ASAN_OPTIONS=detect_leaks=0 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 DYNEMB_EXPECT_EXTENSION_IN=$(SANITIZE_SITE) \
  $(if $(ASAN_SPAWNED),,DYNEMB_SKIP_SPAWNED_RANKS=1)
# The emulated executor's runtime: grid pool, lockstep blocks, fibers, memory model, the
# count of table accesses.
EMULATION_RUNTIME := csrc/emulated/launch.cpp csrc/emulated/lockstep.cpp \
  csrc/emulated/lockstep_rules.cpp csrc/emulated/fiber.cpp csrc/emulated/memory_model.cpp \
  csrc/emulated/access_count.cpp
TSAN_SOURCES := $(wildcard tests/native/tsan_*.cpp) $(EMULATION_RUNTIME) \
  $(wildcard csrc/emulated/*_emulated.cpp)
TSAN_LOCKSTEP := build/sanitize/tsan/lockstep_kernels
TSAN_LITMUS   := build/sanitize/tsan/litmus_kernels

sanitize: sanitize-asan sanitize-tsan

$(SANITIZE_STAMP): $(STAMP) $(BUILD_INPUTS) $(EXT_SOURCES) $(shell find dynemb -name '*.py')
	DYNEMB_SANITIZE=1 MAX_JOBS=2 $(PY) setup.py -q build_ext
	@touch $@

sanitize-asan: $(SANITIZE_STAMP)
	$(ASAN_ENV) $(PY) -c 'import dynemb._C as c, sys; "$(SANITIZE_SITE)/" in c.__file__ or \
	  sys.exit("sanitize-asan: imported " + c.__file__ + ", not the sanitized build")'
	$(ASAN_ENV) $(PY) -m pytest $(SANITIZE_TESTS) -q -x --timeout=900 --import-mode=append \
	  --capture=sys $(PYTEST_WORKERS) \
	  -p no:cacheprovider || [ $$? -eq 5 ]

# ops_emulated.cpp is the torch registration: the driver calls the launchers directly.
$(TSAN_DRIVER): $(TSAN_SOURCES) tests/native/tsan_common.h $(EXT_SOURCES) $(STAMP)
	@mkdir -p $(@D)
	$(CXX) -std=c++20 -O1 -g -fsanitize=thread -Wno-tsan -ffp-contract=off -Wall \
	  -Wno-unused-function -Wno-unknown-pragmas -Icsrc -isystem $$($(PY) -c 'import torch.utils.cpp_extension as c; \
	  print(c.include_paths()[0])') $(filter-out %/ops_emulated.cpp,$(TSAN_SOURCES)) -o $@

# The lockstep primitives under TSan too: its fiber switches are announced to it.
$(TSAN_LOCKSTEP): tests/native/lockstep_kernels.cpp tests/native/lockstep_checks.h $(EXT_SOURCES) $(STAMP)
	@mkdir -p $(@D)
	$(CXX) -std=c++20 -O1 -g -fsanitize=thread -Wno-tsan -Wall -Wno-unknown-pragmas -Icsrc \
	  -isystem $$($(PY) -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])') \
	  $< $(EMULATION_RUNTIME) -o $@

# The memory model's litmus kernels: racy patterns must be reported, ordered ones not
# (tests/csrc/test_emulated_memory_model.py runs each case and checks which).
$(TSAN_LITMUS): tests/native/litmus_kernels.cpp $(EXT_SOURCES) $(STAMP)
	@mkdir -p $(@D)
	$(CXX) -std=c++20 -O1 -g -fsanitize=thread -Wno-tsan -Wall -Wno-unknown-pragmas -Icsrc \
	  -isystem $$($(PY) -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])') \
	  $< $(EMULATION_RUNTIME) -o $@

sanitize-tsan: $(TSAN_DRIVER) $(TSAN_LOCKSTEP) $(TSAN_LITMUS)
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 $(TSAN_DRIVER)
	TSAN_OPTIONS=halt_on_error=1 $(TSAN_LOCKSTEP) $$($(TSAN_LOCKSTEP) list)
	DYNEMB_TSAN_LITMUS=$(TSAN_LITMUS) $(PY) -m pytest tests/csrc/test_emulated_memory_model.py -q \
	  -p no:cacheprovider

BENCHMARKS := $(wildcard benchmark/bench_*.py)

# Benchmarks are not timed tests: CI runs each in --quick mode to prove it runs.
bench-quick: build
	@for b in $(BENCHMARKS); do echo "== $$b --quick"; $(PY) $$b --quick > /dev/null || exit 1; done
	@echo "== benchmark/placement_rules.cpp (built and run small)"; mkdir -p build \
	  && $(CXX) -O2 -std=c++17 -Icsrc benchmark/placement_rules.cpp -o build/placement_rules \
	  && build/placement_rules load 65536 random 1 > /dev/null \
	  && build/placement_rules evict 16384 lru 262144 1.05 40 1024 > /dev/null

# ---------------------------------------------------------------- the GPU run-book
# On a machine with a GPU, nvcc 13 and network (docs/gpu.md, "Run it on a GPU machine"):
#   make gpu-test    .venv-cuda with the CUDA builds of torch/fbgemm-gpu, dynemb built with
#                    DYNEMB_WITH_CUDA=1, then the whole suite with the cuda executor and the
#                    cuda test device (tests/support/devices.py)
#   make gpu-bench   the benchmarks with --device cuda
# Without network: `make wheels-cuda` where pip works, copy wheels-cuda/ beside the
# checkout, then `make gpu-test WHEELS=wheels-cuda`. With a CUDA torch already installed:
# `make gpu-test CUDA_PY=/path/to/python` (no .venv-cuda; that Python needs this project's
# other requirements). None of these is part of `make test`: CI has no GPU.
VENV_CUDA  := .venv-cuda
CUDA_PY    ?= $(VENV_CUDA)/bin/python
CUDA_STAMP := $(VENV_CUDA)/.deps-installed
WHEELS     ?=
# --isolated: this machine's pip config prefers the local CPU wheel of torch 2.13.0.
CUDA_PIP_FROM = $(if $(WHEELS),--no-index --find-links $(WHEELS),--isolated \
  $(if $(PIP_CERT),--cert $(PIP_CERT)))
# requirements.txt without its CPU builds (requirements-cuda.txt replaces them).
CUDA_COMMON := build/requirements-cuda-common.txt
GPU_BENCH_OUT ?= benchmark/out/gpu

$(CUDA_COMMON): requirements.txt
	@mkdir -p $(@D)
	grep -v -e '^torch==' -e '^fbgemm-gpu-cpu==' requirements.txt > $@

# Fails fast, before any download, on a machine without nvcc or without a GPU.
gpu-check:
	@command -v nvcc >/dev/null 2>&1 || { echo "$(or $(MAKECMDGOALS),gpu-check): nvcc not found on PATH: \
	install the CUDA 13 toolkit (the CUDA build compiles csrc/cuda with it)" >&2; exit 2; }
	@{ command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; } \
	  || ls /dev/nvidia[0-9]* >/dev/null 2>&1 || { echo "$(or $(MAKECMDGOALS),gpu-check): no CUDA device on this \
	machine (nvidia-smi lists none, no /dev/nvidia*): run it on a GPU machine; \
	\`make test\` is the CPU suite" >&2; exit 2; }

$(CUDA_STAMP): requirements-cuda.txt $(CUDA_COMMON) requirements-nodeps.txt
	$(PYTHON) -m venv $(VENV_CUDA)
	$(VENV_CUDA)/bin/python -m pip install -q $(CUDA_PIP_FROM) -r requirements-cuda.txt \
	  -r $(CUDA_COMMON)
	$(VENV_CUDA)/bin/python -m pip install -q $(CUDA_PIP_FROM) --no-deps -r requirements-nodeps.txt
	touch $@

venv-cuda: gpu-check $(CUDA_STAMP)

# Every wheel .venv-cuda needs (several GB: torch+cu130 is 527 MB, NVIDIA's runtime
# wheels most of the rest), for a GPU machine without network; run it where pip works,
# with the GPU machine's Python version.
wheels-cuda: $(CUDA_COMMON)
	$(PYTHON) -m pip download -q --isolated --only-binary=:all: -d wheels-cuda \
	  -r requirements-cuda.txt -r $(CUDA_COMMON)
	$(PYTHON) -m pip download -q --isolated --only-binary=:all: --no-deps -d wheels-cuda \
	  -r requirements-nodeps.txt

# The CUDA build goes where the CPU build was (dynemb/_C*.so): the CPU build's stamp is
# removed, so the next `make build` / `make test` rebuilds the CPU extension. Without -x:
# a first run on a GPU should list every failure.
gpu-test: gpu-check $(if $(filter $(VENV_CUDA)/bin/python,$(CUDA_PY)),$(CUDA_STAMP))
	@$(CUDA_PY) -c 'import sys, torch; sys.exit(None if torch.version.cuda and \
	  torch.cuda.is_available() else "gpu-test: $(CUDA_PY) has torch " + torch.__version__ \
	  + (" (no CUDA device visible)" if torch.version.cuda else " (a CPU-only build)"))'
	@rm -f $(EXT_STAMP)
	DYNEMB_WITH_CUDA=1 MAX_JOBS=$$(nproc) $(CUDA_PY) -m pip install -q --no-build-isolation \
	  --no-deps -e .
	DYNEMB_EXECUTOR=cuda DYNEMB_TEST_CUDA=1 $(CUDA_PY) -m pytest tests -q --timeout=600

# The GPU benchmarks (after `make gpu-test`, which builds dynemb for CUDA): JSON lines
# into $(GPU_BENCH_OUT), tables on the terminal.
gpu-bench: gpu-check
	@mkdir -p $(GPU_BENCH_OUT)
	@for b in bench_table bench_train bench_caching bench_train_dmp; do \
	  echo "== benchmark/$$b.py --device cuda"; \
	  $(CUDA_PY) benchmark/$$b.py --device cuda > $(GPU_BENCH_OUT)/$$b.jsonl || exit 1; \
	done
	$(CUDA_PY) benchmark/bench_table.py --device cuda --only hkv > $(GPU_BENCH_OUT)/bench_table_hkv.jsonl

clean:
	rm -rf build dynemb/*.so *.egg-info
