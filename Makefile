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

.PHONY: demo test venv build cuda-check lint bench-quick clean FORCE

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

demo: build
	$(VENV)/bin/torchrun --nproc_per_node=2 example.py --train --eval

# Compiles and links the CUDA build of the extension (every source and flag of
# `DYNEMB_WITH_CUDA=1 pip install`) for sm_80 and sm_90 against torch 2.13.0+cu130, which
# it downloads into TORCH_CUDA_CACHE on first use (mk/cuda-check.mk); needs no .venv.
# Skipped (with the reason printed) on machines without nvcc.
cuda-check:
ifeq ($(NVCC),)
	@echo "cuda-check: skipped, nvcc not found on PATH"
else
	@$(MAKE) --no-print-directory -j2 -f mk/cuda-check.mk PYTHON=$(PYTHON) NVCC=$(NVCC) \
	  TORCH_CUDA_CACHE=$(TORCH_CUDA_CACHE)
	@cat build/cuda-check/_C.so.checked
endif

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
