# dynemb developer entry points. `make demo` and `make test` are the whole set-up:
# both create .venv on first use and build the C++ extension.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.deps-installed
NVCC   ?= $(shell command -v nvcc 2>/dev/null)
CUDA_ARCHS := 80 90
CUDA_SRCS  := $(wildcard csrc/cuda/*.cu)
CUDA_OBJS  := $(patsubst csrc/cuda/%.cu,build/cuda-check/%.o,$(CUDA_SRCS))

.PHONY: demo test venv build cuda-check lint bench-quick clean

$(STAMP): requirements.txt requirements-nodeps.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	touch $@

venv: $(STAMP)

# Rebuild the extension after any C++ edit (editable install, no build isolation, so
# it compiles against the venv's torch).
build: $(STAMP)
	MAX_JOBS=2 $(PY) -m pip install -q --no-build-isolation --no-deps -e .

demo: build
	$(VENV)/bin/torchrun --nproc_per_node=2 example.py --train --eval

# Compiles every CUDA source for sm_80 and sm_90 with the shared core headers; skipped
# (with the reason printed) on machines without nvcc.
cuda-check:
ifeq ($(NVCC),)
	@echo "cuda-check: skipped, nvcc not found on PATH"
else
	@$(MAKE) --no-print-directory $(CUDA_OBJS)
	@echo "cuda-check: compiled $(words $(CUDA_SRCS)) CUDA sources for sm_$(firstword $(CUDA_ARCHS)) and sm_$(lastword $(CUDA_ARCHS))"
endif

build/cuda-check/%.o: csrc/cuda/%.cu $(wildcard csrc/core/*.h csrc/cuda/*.cuh csrc/cuda/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) -c $< -o $@ -std=c++20 -O3 -Icsrc -Werror all-warnings \
	  $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a))

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The whole suite runs twice: on the CPU executor, then on the emulated CUDA executor
# (the csrc/cuda kernels built for the host; see DynamicEmb_APIs.md, "Executors").
# pytest exits 5 when it collects no test: that is not a failure for us.
test: build cuda-check lint bench-quick
	$(PY) -m pytest tests -q -x --timeout=600 || [ $$? -eq 5 ]
	DYNEMB_EXECUTOR=cuda-emulated $(PY) -m pytest tests -q -x --timeout=600 || [ $$? -eq 5 ]

BENCHMARKS := $(wildcard benchmark/bench_*.py)

# Benchmarks are not timed tests: CI runs each in --quick mode to prove it runs.
bench-quick: build
	@for b in $(BENCHMARKS); do echo "== $$b --quick"; $(PY) $$b --quick > /dev/null || exit 1; done

clean:
	rm -rf build dynemb/*.so *.egg-info
