# HYPIC serve: build, run, test.
#
#   make            engine library + hypic-engine, CPU kernels, nginx module,
#                   CUDA kernels when nvcc is present (NO_DEVICE=1 skips them)
#   make run        install what is missing, build, start redis+engine+nginx
#   make test       install what is missing, build (benchmarks too, so they
#                   keep compiling), run every suite (prove)
#   make test-cuda-emu  the CUDA twins on the host emulator, full shape grid,
#                   both thread orders (make test runs a reduced grid:
#                   t/015-cuda-emu.t); needs g++ and python3, not nvcc
#   make asan       the same build with AddressSanitizer + UBSan in build-asan/
#   make test-asan  every suite against that build
#   make format     clang-format our sources in place;  make lint  checks them
#
# Sources are found by globbing, so a new file needs no Makefile edit:
#   engine/<box>/*.c             -> libhypic.a;  engine/cli/*.c -> hypic-engine
#   (one folder per box of DESIGN.md; cli/ and test/ are not boxes of the library)
#   kernels/cpu/*.c              -> libhk_cpu.a
#   kernels/cuda/*.cu            -> libhk_cuda.a (only with nvcc)
#   engine/test/test_*.c, kernels/test/test_*.c -> one TAP binary each

SHELL := /bin/bash
.DEFAULT_GOAL := all

BUILD    ?= build
NVCC     ?= $(shell command -v nvcc 2>/dev/null)
NO_DEVICE ?=
SANITIZE ?=

# python3-embed: the chat templates run in jinja2 (engine/tokenizer/chat.c)
PKGS     := libcjson hiredis libpcre2-8 libxxhash libutf8proc python3-embed
# OpenBLAS's OpenMP build: its GEMM threads are our OpenMP pool, so BLAS
# calls and our own parallel loops never oversubscribe the cores (with
# the pthread build, idle OpenMP workers spin against BLAS threads).
BLAS_DIR   := /usr/lib/x86_64-linux-gnu/openblas-openmp
BLAS_CFLAGS := -I/usr/include/x86_64-linux-gnu/openblas-openmp
BLAS_LIBS  := -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(BLAS_CFLAGS)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) $(BLAS_LIBS)

ARCH_FLAGS ?= -march=native
# -std=c11 turns off FMA contraction; the kernels want it (their tests'
# tolerances are for any summation order).
OPT_FLAGS  ?= -O2 -ffp-contract=fast
WARN_FLAGS := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE -g -fPIC -fopenmp $(OPT_FLAGS) \
              $(ARCH_FLAGS) $(WARN_FLAGS) $(SANITIZE) -I. $(PKG_CFLAGS) \
              $(CFLAGS)
LDFLAGS_ALL := -fopenmp $(SANITIZE) $(LDFLAGS)
LIBS_ALL    := $(PKG_LIBS) -lm -lpthread -lrt

ENGINE_BOXES := $(filter-out engine/cli/ engine/test/,$(wildcard engine/*/))
# backend_cuda.c goes only into the programs built with the CUDA library
ENGINE_SRCS := $(filter-out engine/backend/backend_cuda.c, \
                 $(wildcard $(addsuffix *.c,$(ENGINE_BOXES))))
CLI_SRCS    := $(wildcard engine/cli/*.c)
KCPU_SRCS   := $(wildcard kernels/cpu/*.c)
KCUDA_SRCS  := $(wildcard kernels/cuda/*.cu)
TEST_SRCS   := $(wildcard engine/test/test_*.c kernels/test/test_*.c)
HEADERS     := $(wildcard engine/*/*.h kernels/*.h kernels/*/*.h t/lib/*.h)

ENGINE_OBJS := $(ENGINE_SRCS:%.c=$(BUILD)/obj/%.o)
KCPU_OBJS   := $(KCPU_SRCS:%.c=$(BUILD)/obj/%.o)
TEST_BINS   := $(patsubst %.c,$(BUILD)/test/%,$(notdir $(TEST_SRCS)))
BENCH_BINS  := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))

LIBHYPIC := $(BUILD)/libhypic.a
LIBKCPU  := $(BUILD)/libhk_cpu.a
ENGINE   := $(BUILD)/hypic-engine
MODULE   := $(BUILD)/nginx/ngx_http_hypic_module.so

CUDA_TARGET :=
ifneq ($(NVCC),)
ifeq ($(NO_DEVICE),)
ifneq ($(KCUDA_SRCS),)
CUDA_TARGET := $(BUILD)/libhk_cuda.a
endif
endif
endif

# The CUDA backend (engine/backend/backend_cuda.c) and what it needs, in
# the programs that can run on a GPU: hypic-engine and the CUDA tests.
# Elsewhere backend.c's weak reference to it stays NULL ("no CUDA").
CUDA_BACKEND := $(if $(CUDA_TARGET),$(BUILD)/obj/engine/backend/backend_cuda.o)

.PHONY: all engine module cuda tests deps run test asan test-asan format \
        lint clean golden bench test-cuda-emu fuzz fuzz-build
all: engine module tests $(CUDA_TARGET)
engine: $(ENGINE)
module: $(MODULE)
tests: $(TEST_BINS)
cuda: $(CUDA_TARGET)

# V=1 shows the full commands.
Q := $(if $(V),,@)
$(BUILD)/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS_ALL) -c $< -o $@

$(LIBHYPIC): $(ENGINE_OBJS)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIBKCPU): $(KCPU_OBJS)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(ENGINE): $(CLI_SRCS:%.c=$(BUILD)/obj/%.o) $(CUDA_BACKEND) $(LIBHYPIC) \
          $(LIBKCPU) $(CUDA_TARGET)
	@$(if $(Q),echo "  LINK    $@")
	$(Q)$(CC) $(LDFLAGS_ALL) -o $@ $(filter %.o,$^) $(LIBHYPIC) $(LIBKCPU) \
	    $(CUDA_TARGET) $(LIBS_ALL) $(if $(CUDA_TARGET),$(CUDA_LIBS))

vpath test_%.c engine/test kernels/test
$(BUILD)/test/%: %.c $(LIBHYPIC) $(LIBKCPU) $(HEADERS) \
                 $(wildcard engine/test/*.h)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TEST    $@")
	$(Q)$(CC) $(CFLAGS_ALL) $(LDFLAGS_ALL) -o $@ $< $(LIBHYPIC) $(LIBKCPU) \
	    $(LIBS_ALL)

# CUDA twin tests (kernels/test/test_cuda_*.c): with libhk_cuda.a built,
# compiled with HK_HAVE_CUDA and linked against it and the CUDA runtime
# (they compare against the CPU kernels and SKIP where no device exists);
# without it (no nvcc, or NO_DEVICE=1), built skip-only, no nvcc needed.
# cudart is linked statically: it opens the driver (libcuda) at run time,
# so a binary starts, and finds no device, on a machine without a GPU.
CUDA_HOME ?= /usr/local/cuda
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas \
             -lcudart_static -ldl -lrt -lpthread -lstdc++
$(BUILD)/test/test_cuda_%: test_cuda_%.c $(LIBHYPIC) $(LIBKCPU) $(CUDA_TARGET) \
                           $(CUDA_BACKEND) $(HEADERS) $(wildcard engine/test/*.h)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TEST    $@")
	$(Q)$(CC) $(CFLAGS_ALL) $(if $(CUDA_TARGET),-DHK_HAVE_CUDA) \
	    $(LDFLAGS_ALL) -o $@ $< $(CUDA_BACKEND) $(CUDA_TARGET) $(LIBHYPIC) \
	    $(LIBKCPU) \
	    $(LIBS_ALL) $(if $(CUDA_TARGET),$(CUDA_LIBS))

# Benchmarks: built by `make bench`, run by hand (bench/README.md); one
# program per bench/*.c, sharing only bench/*.h (static inline helpers).
bench: $(filter-out $(if $(CUDA_TARGET),,$(BUILD)/bench/gpu_%),$(BENCH_BINS))
$(BUILD)/bench/%: bench/%.c $(LIBHYPIC) $(LIBKCPU) $(HEADERS) \
                  $(wildcard bench/*.h)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  BENCH   $@")
	$(Q)$(CC) $(CFLAGS_ALL) $(LDFLAGS_ALL) -o $@ $< $(LIBHYPIC) $(LIBKCPU) \
	    $(LIBS_ALL)

# GPU benches (bench/gpu_*.c): linked with libhk_cuda.a, built only with it.
# With the CUDA backend too (gpu_engine runs the whole model there).
$(BUILD)/bench/gpu_%: bench/gpu_%.c $(LIBHYPIC) $(LIBKCPU) $(CUDA_TARGET) \
                      $(CUDA_BACKEND) $(HEADERS) $(wildcard bench/*.h)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  BENCH   $@")
	$(Q)$(CC) $(CFLAGS_ALL) $(LDFLAGS_ALL) -o $@ $< $(CUDA_BACKEND) \
	    $(CUDA_TARGET) $(LIBHYPIC) $(LIBKCPU) $(LIBS_ALL) $(CUDA_LIBS)

# CUDA twins: compiled and linked here, run only where a device exists.
# Machine code for A100 (sm_80) and H100 (sm_90a), and compute_90 PTX that
# later GPUs compile when they load it. CUDA_ARCH="-arch=sm_90a" builds one
# target (a third of the time) while iterating.
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 \
             -gencode arch=compute_90a,code=sm_90a \
             -gencode arch=compute_90,code=compute_90
# ptxas's "Potential Performance Loss" notes (C751x, C7520: wgmma
# serialized, a wait injected) fail the build: each has meant a Hopper
# kernel running at a fraction of its speed, and no test without a GPU
# would see it. ptxas's -v report stays in $@.log (its per-kernel lines
# not echoed): t/017-ptxas.t checks each kernel's spills against
# kernels/cuda/ptxas-sm90a.tsv (tools/ptxas_report.py).
PTXAS_V := ^ptxas info *: (Compiling entry|Function properties|Used [0-9]+
PTXAS_V := $(PTXAS_V) registers|[0-9]+ bytes gmem|Compile time)|^ +[0-9]+ bytes stack
$(BUILD)/obj/%.cu.o: %.cu $(HEADERS) $(wildcard kernels/cuda/*.h)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) -O2 -std=c++17 $(CUDA_ARCH) -Xptxas -v -Xcompiler -fPIC -I. \
	    -c $< -o $@ 2>$@.log; rc=$$?; \
	grep -Ev '$(PTXAS_V)' $@.log >&2 || true; \
	if grep -q 'Potential Performance Loss' $@.log; then \
	    echo "$<: ptxas serialized wgmma (above)" >&2; rm -f $@; exit 1; \
	fi; exit $$rc
$(BUILD)/libhk_cuda.a: $(KCUDA_SRCS:%.cu=$(BUILD)/obj/%.cu.o)
	$(Q)rm -f $@ && ar rcs $@ $^

# The nginx module, built against Debian's nginx-dev: configure once into
# our build folder, then rebuild incrementally. The module's own sources and
# the contract files it shares with the engine are listed in ./config.
NGX_SRC   := /usr/share/nginx/src
MODULE_SRCS := $(wildcard ngx_hypic_module/*.c ngx_hypic_module/*.h) config
$(BUILD)/nginx/Makefile: config
	@mkdir -p $(BUILD)/nginx
	cd $(NGX_SRC) && . ./conf_flags && ./configure \
	    --with-cc-opt="$$(dpkg-buildflags --get CFLAGS) -fPIC $$(dpkg-buildflags --get CPPFLAGS) $(SANITIZE)" \
	    --with-ld-opt="$$(dpkg-buildflags --get LDFLAGS) -fPIC $(SANITIZE)" \
	    "$${NGX_CONF_FLAGS[@]}" --add-dynamic-module=$(CURDIR) \
	    --builddir=$(CURDIR)/$(BUILD)/nginx > $(CURDIR)/$(BUILD)/nginx/configure.log
$(MODULE): $(BUILD)/nginx/Makefile $(MODULE_SRCS) $(HEADERS) \
           $(wildcard engine/contract/hp_seg*.c engine/contract/hp_ipc*.c \
                      engine/contract/hp_tool*.c engine/contract/hp_grammar*.c)
	$(MAKE) -f $(CURDIR)/$(BUILD)/nginx/Makefile -C $(NGX_SRC) modules \
	    > $(BUILD)/nginx/make.log || { cat $(BUILD)/nginx/make.log; exit 1; }

deps:
	@tools/install-deps.sh

run: deps
	@$(MAKE) --no-print-directory all
	@tools/run.sh

PROVE_FLAGS ?=
test: deps
	@$(MAKE) --no-print-directory all bench fuzz-build
	HYPIC_BUILD=$(CURDIR)/$(BUILD) HYPIC_FUZZ_BUILD=$(CURDIR)/$(FUZZ_BUILD) \
	    prove $(PROVE_FLAGS) $(TEST_BINS) t/*.t

# The CUDA kernels compiled by g++ against kernels/cuda/emu and compared
# with the CPU kernels on every shape, threads in tid order then reversed.
test-cuda-emu: $(LIBKCPU) $(LIBHYPIC)
	HK_EMU_BUILD=$(CURDIR)/$(BUILD)/cuda-emu HK_EMU_ENGINE=$(LIBHYPIC) \
	    kernels/cuda/emu/run.sh $(LIBKCPU)

ASAN_VARS := BUILD=build-asan OPT_FLAGS=-O1 \
    SANITIZE="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
asan:
	@$(MAKE) --no-print-directory $(ASAN_VARS) all
# The suites under the sanitizers; nginx gets libasan preloaded by t/lib.
test-asan: deps
	@$(MAKE) --no-print-directory $(ASAN_VARS) all
	HYPIC_BUILD=$(CURDIR)/build-asan HYPIC_ASAN=1 \
	    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	    prove $(PROVE_FLAGS) $(patsubst $(BUILD)/%,build-asan/%,$(TEST_BINS)) t/*.t

# libFuzzer targets, one per fuzz/fuzz_*.c (fuzz/README.md): clang with
# ASan+UBSan, against a libhypic built the same way in build-fuzz/; the
# module's JSON check compiles against nginx's own headers (configured by
# the module build) and links no nginx object. `make fuzz` runs each for
# FUZZ_SECONDS; `make test` runs each for a few seconds (t/099-fuzz.t).
FUZZ_BUILD   := build-fuzz
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer \
                -fno-sanitize-recover=undefined
FUZZ_BINS    := $(patsubst fuzz/%.c,$(FUZZ_BUILD)/fuzz/%, \
                           $(wildcard fuzz/fuzz_*.c))
NGX_CONF     ?= $(BUILD)/nginx
NGX_INCS     := $(addprefix -I$(NGX_SRC)/src/,core event event/modules \
                                                os/unix) -I$(NGX_CONF)

fuzz-build: $(BUILD)/nginx/Makefile
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) \
	    CFLAGS=-Wno-pass-failed OPT_FLAGS="-O1 -ffp-contract=fast" \
	    SANITIZE="-fsanitize=fuzzer-no-link $(FUZZ_SAN)" \
	    NGX_CONF=$(CURDIR)/$(BUILD)/nginx $(FUZZ_BINS)

$(FUZZ_BUILD)/fuzz/fuzz_json: ngx_hypic_module/ngx_http_hypic_json_parse.c
$(FUZZ_BUILD)/fuzz/%: fuzz/%.c $(LIBHYPIC) $(LIBKCPU) $(HEADERS) \
                      $(wildcard fuzz/*.h ngx_hypic_module/*_parse.h)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  FUZZ    $@")
	$(Q)$(CC) $(CFLAGS_ALL) $(if $(filter %json,$@),$(NGX_INCS)) \
	    -fsanitize=fuzzer $(LDFLAGS_ALL) -o $@ $< \
	    $(filter %_parse.c,$^) $(LIBHYPIC) $(LIBKCPU) $(LIBS_ALL)

fuzz: fuzz-build
	@for t in $(FUZZ_BINS); do \
	    fuzz/run.sh $$t $(FUZZ_SECONDS) || exit 1; \
	done

FORMAT_SRCS = $(shell git ls-files '*.c' '*.h' '*.cu' '*.cuh' | grep -v -e '^ngx_hypic_module/' -e '^kernels/cuda/emu/')
format:
	clang-format -i $(FORMAT_SRCS)
lint:
	clang-format --dry-run -Werror $(FORMAT_SRCS)
	cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability \
	    --std=c11 --inline-suppr -I. engine kernels
	tools/check-layering.sh

golden:
	python3 tools/make_golden.py

clean:
	rm -rf build build-asan $(FUZZ_BUILD)
