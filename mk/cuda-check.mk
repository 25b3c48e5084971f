# `make cuda-check` runs this file (`$(MAKE) -f mk/cuda-check.mk`). It compiles and links
# the CUDA build of the extension, what `DYNEMB_WITH_CUDA=1 pip install
# --no-build-isolation -e .` builds for a GPU user, against the CUDA build of torch 2.13.0,
# downloaded once per machine into TORCH_CUDA_CACHE. Sources and flags come from setup.py
# and from that torch (tools/cuda_check.py writes them into $(BUILD)/flags.mk).
# ptxas reports each kernel's registers, stack, spills and shared memory for every arch
# (-Xptxas -v, kept in $(BUILD)/<source>.ptxas); tools/ptxas_resources.py gathers them into
# $(BUILD)/resources.{json,tsv,md} and fails the check on any spill.
PYTHON     ?= python3
NVCC       ?= nvcc
CUDA_HOME  ?= /usr/local/cuda
CUDA_ARCHS ?= 80 90
ifndef TORCH_CUDA_CACHE
$(error TORCH_CUDA_CACHE is not set: run `make cuda-check`)
endif

BUILD    := build/cuda-check
comma    := ,
FLAGS_MK := $(BUILD)/flags.mk
CACHED   := $(TORCH_CUDA_CACHE)/.complete
SO       := $(BUILD)/_C.so
RESOURCES := $(BUILD)/resources.checked

.PHONY: all FORCE
.DELETE_ON_ERROR:

all: $(SO).checked

# Download and extraction happen once; the cache folder appears only when complete.
$(CACHED):
	$(PYTHON) tools/cuda_check.py fetch $(TORCH_CUDA_CACHE)

# Rewritten only when its content changes, so that editing setup.py rebuilds objects only
# when a flag changed.
$(FLAGS_MK): $(CACHED) setup.py tools/cuda_check.py mk/cuda-check.mk
	@mkdir -p $(@D)
	@$(PYTHON) tools/cuda_check.py flags $(TORCH_CUDA_CACHE) $(NVCC) $(CUDA_HOME) $(CUDA_ARCHS) > $@.tmp
	@if cmp -s $@.tmp $@; then rm $@.tmp; else mv $@.tmp $@; fi

include $(FLAGS_MK)

SRCS     := $(sort $(wildcard $(CUDA_CHECK_SOURCE_PATTERNS)))
CU_SRCS  := $(filter %.cu,$(SRCS))
CXX_SRCS := $(filter %.cpp,$(SRCS))
OBJS     := $(SRCS:%=$(BUILD)/%.o)
PTXAS    := $(CU_SRCS:%=$(BUILD)/%.ptxas)

# -Werror all-warnings and -Xptxas -v: cuda-check's own strictness and ptxas's resource
# report; neither changes the generated code. The report (stderr) goes to the .ptxas file,
# one per source so that parallel compiles do not interleave; everything else nvcc says
# (an error, say) is shown. A pattern rule's targets are made together: an object without
# its report is rebuilt.
$(BUILD)/%.cu.o $(BUILD)/%.cu.ptxas: %.cu $(FLAGS_MK)
	@mkdir -p $(@D)
	$(NVCC) -MMD -MP -MF $(BUILD)/$<.d -c $< -o $(BUILD)/$<.o $(CUDA_CHECK_NVCCFLAGS) \
	  -Werror all-warnings -Xptxas -v 2> $(BUILD)/$<.ptxas; rc=$$?; \
	  grep -v -e '^ptxas info' -e '^ *[0-9]* bytes stack frame' $(BUILD)/$<.ptxas >&2; \
	  exit $$rc

# -O0 (after setup.py's -O3): the C++ sources compile here to prove that they build
# against the CUDA torch and link with the CUDA objects; the CPU build compiles the same
# sources at -O3 with -Wall, and the optimiser would only double this check's time.
$(BUILD)/%.cpp.o: %.cpp $(FLAGS_MK)
	@mkdir -p $(@D)
	$(CXX) -MMD -MP -MF $(@:.o=.d) $(CUDA_CHECK_CXXFLAGS) -O0 -c $< -o $@

# The link setuptools runs. Then the proof that it resolves: no dynemb symbol is left
# undefined, and (where libpython is a shared library) a second link with --no-undefined
# resolves every symbol against torch, libcudart and libpython.
$(SO): $(OBJS) $(BUILD)/objects
	$(CXX) $(OBJS) $(CUDA_CHECK_LDFLAGS) -o $@

# The object list, rewritten only when it changes: removing a source relinks.
$(BUILD)/objects: FORCE
	@mkdir -p $(@D)
	@echo $(OBJS) > $@.tmp
	@if cmp -s $@.tmp $@; then rm $@.tmp; else mv $@.tmp $@; fi

# Registers, spills and shared memory of every kernel and arch; fails on any spill (the
# report is written either way).
$(RESOURCES): $(PTXAS) tools/ptxas_resources.py
	$(PYTHON) tools/ptxas_resources.py --checked $@ --nvcc $(NVCC) $(BUILD) $(PTXAS)

$(SO).checked: $(SO) $(RESOURCES)
	@undefined=$$(nm -D --undefined-only -C $(SO) | grep 'dynemb::' || true); \
	if [ -n "$$undefined" ]; then \
	  echo "cuda-check: $(SO) leaves dynemb symbols undefined:"; echo "$$undefined"; exit 1; \
	fi
	$(if $(CUDA_CHECK_PYLIB),$(CXX) $(OBJS) $(CUDA_CHECK_LDFLAGS) $(CUDA_CHECK_PYLIB) \
	  -Wl$(comma)--no-undefined -o $(BUILD)/_C.no-undefined.so && rm $(BUILD)/_C.no-undefined.so)
	@echo "cuda-check: compiled $(words $(CU_SRCS)) CUDA sources (sm_$(subst $() $(),$(comma) sm_,$(CUDA_ARCHS))) and $(words $(CXX_SRCS)) C++ sources against torch 2.13.0+cu130, linked $(SO)$(if $(CUDA_CHECK_PYLIB), (also with --no-undefined)), 0 undefined dynemb symbols" > $@
	@cat $(RESOURCES) >> $@

FORCE:

-include $(OBJS:.o=.d)
