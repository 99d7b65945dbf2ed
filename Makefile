# Braid: one entry point. `make` builds the libraries and tools,
# `make test` / `make run` install missing Debian packages first.
PREFIX ?= /usr/local
BUILD  ?= build
CC     ?= cc
MPICC  ?= mpicc

# ---------------------------------------------------------------- layers
# The folders each top-level folder may include from (DESIGN.md, "Layout").
# A source is compiled with only its own folder's list on the include path,
# so a forbidden include does not compile; scripts/check-layers.sh (part of
# make test) checks every #include "..." against the same lists, printed by
# `make print-layers`, and names the rule a crossing breaks.
LAYERS           := common kernels algorithms transports src perf trainer tests
LAYER_common     := include common
LAYER_kernels    := include common kernels
LAYER_algorithms := include common algorithms
LAYER_transports := include common src transports
LAYER_src        := include common kernels algorithms transports src
LAYER_perf       := include perf
LAYER_trainer    := include trainer
LAYER_tests      := include common kernels algorithms transports src tests
# -I flags for the source $(1): its top folder's list.
layer_inc = $(addprefix -I,$(LAYER_$(firstword $(subst /, ,$(1)))))
TEST_INC := $(call layer_inc,tests/)

# ---------------------------------------------------------------- optional parts
# Probed once; a plain `make` needs only a C compiler. Override on the
# command line (make HAVE_CUDA=0) to build without a part that is present.
CUDA_HOME ?= /usr/local/cuda
ifeq ($(origin NVCC),undefined)
NVCC := $(shell command -v nvcc 2>/dev/null || \
          { test -x '$(CUDA_HOME)/bin/nvcc' && echo '$(CUDA_HOME)/bin/nvcc'; })
endif
ifeq ($(origin HAVE_CUDA),undefined)
HAVE_CUDA := $(if $(NVCC),1,0)
endif
# libibverbs is dlopen'ed (DESIGN.md): its header is all the build needs.
ifeq ($(origin HAVE_IBVERBS),undefined)
HAVE_IBVERBS := $(shell printf '\043include <infiniband/verbs.h>\n' | \
                  $(CC) -E -x c - >/dev/null 2>&1 && echo 1 || echo 0)
endif

CFLAGS_BASE := -std=c11 -O2 -g -Wall -Wextra -fPIC -fvisibility=hidden \
               -D_GNU_SOURCE -ffp-contract=off -pthread \
               $(if $(filter 1,$(HAVE_CUDA)),-DBRAID_HAVE_CUDA=1) \
               $(if $(filter 1,$(HAVE_IBVERBS)),-DBRAID_HAVE_IBVERBS=1)
CFLAGS ?=
LDFLAGS ?=
ALL_CFLAGS := $(CFLAGS_BASE) $(CFLAGS)
LDLIBS := -pthread -lm
# Objects list the headers they include (-MMD) and survive a header's
# removal (-MP), instead of every object depending on every header.
DEPFLAGS := -MMD -MP

# Per-file ISA flags: the dispatcher picks these at run time.
ISA_avx2   := -mavx2 -mf16c -mfma
ISA_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mf16c -mfma

# Folders that join the library only when their dependency is present.
CUDA_DIRS := src/cuda kernels/cuda transports/cudaipc
IB_DIRS   := transports/ib
CUDA_SRCS := $(wildcard src/cuda/*.c kernels/cuda/*.c transports/cudaipc/*.c)
CUDA_CU   := $(wildcard kernels/cuda/*.cu)
IB_SRCS   := $(wildcard transports/ib/*.c)

LIB_SRCS := $(wildcard common/*.c) $(wildcard src/*.c) $(wildcard transports/*.c) \
            $(filter-out $(addsuffix /%,$(CUDA_DIRS) $(IB_DIRS)),$(wildcard transports/*/*.c)) \
            $(wildcard algorithms/*.c) $(wildcard kernels/cpu/*.c)
ifeq ($(HAVE_CUDA),1)
LIB_SRCS += $(CUDA_SRCS)
else ifneq ($(strip $(CUDA_SRCS) $(CUDA_CU)),)
$(info CUDA parts skipped ($(CUDA_DIRS)): HAVE_CUDA=$(HAVE_CUDA), no nvcc on PATH or in CUDA_HOME=$(CUDA_HOME))
endif
ifeq ($(HAVE_IBVERBS),1)
LIB_SRCS += $(IB_SRCS)
else ifneq ($(strip $(IB_SRCS)),)
$(info InfiniBand transport skipped ($(IB_DIRS)): HAVE_IBVERBS=$(HAVE_IBVERBS), <infiniband/verbs.h> does not preprocess (libibverbs-dev))
endif
LIB_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRCS))
# CUDA kernels: each .cu becomes a fatbin embedded as a byte array (the
# library loads it through the driver; it links no CUDA library).
ifeq ($(HAVE_CUDA),1)
LIB_OBJS += $(patsubst %.cu,$(BUILD)/obj/%.fatbin.o,$(CUDA_CU))
endif

LIBDIR := $(BUILD)/lib
BINDIR := $(BUILD)/bin
TSTDIR := $(BUILD)/tests

SHLIB  := $(LIBDIR)/libbraid.so
STLIB  := $(LIBDIR)/libbraid.a
NCCLSO := $(LIBDIR)/libnccl.so.2

PERF_COMMON := $(filter-out perf/%_perf.c perf/mpi_%.c,$(wildcard perf/*.c))
PERF_MAINS  := $(filter-out perf/mpi_%.c,$(wildcard perf/*_perf.c))
PERF_BINS   := $(patsubst perf/%.c,$(BINDIR)/%,$(PERF_MAINS))
HAVE_MPI    := $(shell command -v $(MPICC) >/dev/null 2>&1 && echo 1)
MPI_PERF    := $(if $(HAVE_MPI),$(patsubst perf/%.c,$(BINDIR)/%,$(wildcard perf/mpi_*.c)))

# test_cuda_* need the toolkit's cuda.h and the simulated driver: HAVE_CUDA only.
# test_ib_* need <infiniband/verbs.h> and the verbs emulation: HAVE_IBVERBS only.
UNIT_SRCS  := $(filter-out $(if $(filter 1,$(HAVE_CUDA)),,tests/unit/test_cuda_%.c) \
                $(if $(filter 1,$(HAVE_IBVERBS)),,tests/unit/test_ib_%.c),\
                $(wildcard tests/unit/test_*.c))
UNIT_BINS  := $(patsubst tests/unit/%.c,$(TSTDIR)/%,$(UNIT_SRCS))
MP_COMMON  := $(filter-out tests/mp/test_%.c,$(wildcard tests/mp/*.c))
# mp_test_device* run device buffers on the simulated driver: HAVE_CUDA only.
# mp_test_ib runs the verbs transport on the emulation: HAVE_IBVERBS only.
MP_SRCS    := $(filter-out $(if $(filter 1,$(HAVE_CUDA)),,tests/mp/test_device%.c) \
                $(if $(filter 1,$(HAVE_IBVERBS)),,tests/mp/test_ib.c),\
                $(wildcard tests/mp/test_*.c))
MP_BINS    := $(patsubst tests/mp/%.c,$(TSTDIR)/mp_%,$(MP_SRCS))

.PHONY: all lib tools tests unit-mp-tests test run bench bench-shm bench-cluster install clean \
        deps format test-sanitize fuzz fuzz-targets check-layers print-layers test-torch bench-torch
all: lib tools

lib: $(SHLIB) $(STLIB) $(NCCLSO) $(LIBDIR)/libnccl.so
tools: $(PERF_BINS) $(MPI_PERF)
tests: $(UNIT_BINS) $(MP_BINS)
# The sanitizer builds (scripts/test-sanitize.sh) need only these two kinds.
unit-mp-tests: $(UNIT_BINS) $(MP_BINS)

# The driver shim includes the toolkit's cuda.h (types only: it links
# nothing of CUDA).
$(BUILD)/obj/src/cuda/%.o: src/cuda/%.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(call layer_inc,$<) -I$(CUDA_HOME)/include $(DEPFLAGS) -c $< -o $@

$(BUILD)/obj/%_avx2.o: %_avx2.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(call layer_inc,$<) $(DEPFLAGS) $(ISA_avx2) -c $< -o $@

$(BUILD)/obj/%_avx512.o: %_avx512.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(call layer_inc,$<) $(DEPFLAGS) $(ISA_avx512) -c $< -o $@

# Objects depend on the Makefile too: its flags and include rules are part
# of every compile (and an object from before -MMD has no .d to go by).
$(BUILD)/obj/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(call layer_inc,$<) $(DEPFLAGS) -c $< -o $@

# SASS for Ampere, Hopper and Blackwell, and Blackwell's PTX for what comes
# after; no fused multiply-add, so results match the CPU kernels bit for bit.
NVCC_ARCHS ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_100,code=[sm_100,compute_100]
NVCC_FLAGS ?= -O3 -fmad=false $(NVCC_ARCHS)
$(BUILD)/obj/%.fatbin: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) $(call layer_inc,$<) -MMD -MP -MF $(@:.fatbin=.d) --fatbin $< -o $@

# kernels/cuda/reduce.cu -> braid_fatbin_reduce[] and braid_fatbin_reduce_len (od, not
# bin2c: its aligned output needs CUDA's headers)
$(BUILD)/obj/%.fatbin.c: $(BUILD)/obj/%.fatbin
	@n=braid_fatbin_$(notdir $*); \
	{ echo "__attribute__((aligned(8))) const unsigned char $$n[] = {"; \
	  od -An -v -tx1 $< | sed 's/\([0-9a-f][0-9a-f]\)/0x\1,/g'; \
	  echo "};"; echo "const unsigned long $${n}_len = sizeof($$n);"; } > $@

$(BUILD)/obj/%.fatbin.o: $(BUILD)/obj/%.fatbin.c
	$(CC) $(ALL_CFLAGS) -c $< -o $@
.PRECIOUS: $(BUILD)/obj/%.fatbin $(BUILD)/obj/%.fatbin.c

-include $(LIB_OBJS:.o=.d) $(patsubst %.cu,$(BUILD)/obj/%.d,$(CUDA_CU))

$(SHLIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libbraid.so -o $@ $(LIB_OBJS) $(LDLIBS)

# The same objects again, named as NCCL so existing binaries load Braid.
$(NCCLSO): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libnccl.so.2 -o $@ $(LIB_OBJS) $(LDLIBS)

$(LIBDIR)/libnccl.so: $(NCCLSO)
	ln -sf libnccl.so.2 $@

$(STLIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $(LIB_OBJS)

# With Open MPI present the perf tools bootstrap through MPI_Bcast under
# mpirun; without it they still run with -t N ranks as threads.
PERF_CC    := $(if $(HAVE_MPI),$(MPICC) -DPERF_HAVE_MPI=1,$(CC))

$(BINDIR)/%_perf: perf/%_perf.c $(PERF_COMMON) perf/*.h $(STLIB)
	@mkdir -p $(dir $@)
	$(PERF_CC) $(ALL_CFLAGS) $(call layer_inc,$<) $(LDFLAGS) -fvisibility=default $< $(PERF_COMMON) \
	  -o $@ $(STLIB) $(LDLIBS)

$(TSTDIR)/test_%: tests/unit/test_%.c $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) $(LDFLAGS) $< -o $@ $(STLIB) -lcmocka -ldl $(LDLIBS)

# test_topo checks detection against hwloc itself; the library opens hwloc
# at run time and links nothing of it.
$(TSTDIR)/test_topo: LDLIBS += -lhwloc

# The unit tests that link tests/common: the executors over the fake
# transport, and the CUDA kernel body under the CPU grid emulation (included
# as "common/...": tests/ is on their path, the repository root is not, so
# the name cannot reach the bottom common/).
UNIT_COMMON := $(filter-out tests/common/cudasim%.c,$(wildcard tests/common/*.c))
FAKE_TESTS  := $(TSTDIR)/test_schedule $(TSTDIR)/test_executor $(TSTDIR)/test_kern_cuda
$(FAKE_TESTS): $(TSTDIR)/test_%: tests/unit/test_%.c $(UNIT_COMMON) tests/common/*.h $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) $(LDFLAGS) $< $(UNIT_COMMON) -o $@ $(STLIB) -lcmocka -ldl $(LDLIBS)

# The simulated CUDA driver (tests/common/cudasim.c) that BRAID_CUDA_LIB
# loads where there is no GPU, and the unit tests of src/cuda, which run on it.
ifeq ($(HAVE_CUDA),1)
CUDASIM := $(TSTDIR)/libcudasim.so
$(CUDASIM): tests/common/cudasim.c tests/common/cudasim_mem.c tests/common/kern_emulate.c \
            tests/common/*.h \
            kernels/cuda/kern_body.h kernels/kern_convert.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -Itests/common -I$(CUDA_HOME)/include -shared \
	  tests/common/cudasim.c tests/common/cudasim_mem.c tests/common/kern_emulate.c -o $@ -pthread
$(TSTDIR)/test_cuda_%: tests/unit/test_cuda_%.c $(UNIT_COMMON) tests/common/*.h $(STLIB) $(CUDASIM)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -I$(CUDA_HOME)/include $(LDFLAGS) $< $(UNIT_COMMON) -o $@ \
	  $(STLIB) -lcmocka -ldl $(LDLIBS)
endif

# The verbs emulation (tests/common/fakeverbs) that LD_LIBRARY_PATH selects
# in place of libibverbs.so.1, and the unit tests of transports/ib.
ifeq ($(HAVE_IBVERBS),1)
FAKEVERBS := $(TSTDIR)/fakeverbs/libibverbs.so.1
$(FAKEVERBS): tests/common/fakeverbs/*.c tests/common/fakeverbs/*.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -shared -Wl,-soname,libibverbs.so.1 $(filter %.c,$^) -o $@ -pthread
# The emulation's own test calls verbs directly: linked to it, found by rpath.
$(TSTDIR)/test_ib_fakeverbs: tests/unit/test_ib_fakeverbs.c $(FAKEVERBS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) $< -o $@ -L$(dir $(FAKEVERBS)) -l:libibverbs.so.1 \
	  -Wl,-rpath,'$$ORIGIN/fakeverbs' -lcmocka
$(TSTDIR)/test_ib_%: tests/unit/test_ib_%.c $(STLIB) $(FAKEVERBS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) $(LDFLAGS) $< -o $@ $(STLIB) -lcmocka -ldl $(LDLIBS)
endif

$(TSTDIR)/mp_test_%: tests/mp/test_%.c $(MP_COMMON) tests/mp/*.h $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) $(LDFLAGS) -Itests/mp $< $(MP_COMMON) -o $@ $(STLIB) -lcmocka $(LDLIBS)
$(TSTDIR)/mp_test_device $(TSTDIR)/mp_test_device_p2p: $(CUDASIM)
$(TSTDIR)/mp_test_ib: $(FAKEVERBS)

# ---------------------------------------------------------------- braid-train (trainer/)
# Data-parallel SGD on Fashion-MNIST. Built with mpicc when Open MPI is present: under mpirun
# MPI only broadcasts the unique id; gradients always go through Braid. Its tests link the
# same sources (without MPI) and run from scripts/run-tests.sh: build/tests/test_trainer_*
# and tests/trainer/*.sh, which uses build/tests/trainer_ckpt_diff.
TRAIN_SRCS  := $(filter-out trainer/main.c,$(wildcard trainer/*.c))
TRAIN_HDRS  := $(wildcard trainer/*.h)
TRAIN_BIN   := $(BINDIR)/braid-train
TRAIN_LIBS  := -lopenblas -lz
# -O3: the element-wise loops vectorize (exactly)
TRAIN_FLAGS := $(ALL_CFLAGS) -O3 $(call layer_inc,trainer/)
TRAIN_CC    := $(if $(HAVE_MPI),$(MPICC) -DTRAIN_HAVE_MPI=1,$(CC))
TRAIN_TESTS := $(patsubst tests/trainer/%.c,$(TSTDIR)/%,$(wildcard tests/trainer/test_trainer_*.c)) \
               $(TSTDIR)/trainer_ckpt_diff

# OpenBLAS and zlib come with `make deps` (which make test and make run call first); a plain
# `make` without them still builds the library and the perf tools.
HAVE_TRAIN_DEPS := $(shell printf '\043include <cblas.h>\n\043include <zlib.h>\n' | \
                     $(CC) -E -x c - >/dev/null 2>&1 && echo 1)
ifeq ($(HAVE_TRAIN_DEPS),1)
tools: $(TRAIN_BIN)
tests: $(TRAIN_TESTS)
else
$(info braid-train skipped: no OpenBLAS/zlib headers (make deps installs them))
endif

$(TRAIN_BIN): trainer/main.c $(TRAIN_SRCS) $(TRAIN_HDRS) $(STLIB)
	@mkdir -p $(dir $@)
	$(TRAIN_CC) $(TRAIN_FLAGS) $(LDFLAGS) trainer/main.c $(TRAIN_SRCS) -o $@ $(STLIB) $(TRAIN_LIBS) $(LDLIBS)

$(TSTDIR)/test_trainer_%: tests/trainer/test_trainer_%.c $(TRAIN_SRCS) $(TRAIN_HDRS) $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(TRAIN_FLAGS) $(LDFLAGS) $< $(TRAIN_SRCS) -o $@ $(STLIB) -lcmocka $(TRAIN_LIBS) $(LDLIBS)

$(TSTDIR)/trainer_ckpt_diff: tests/trainer/ckpt_diff.c trainer/checkpoint.c $(TRAIN_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(TRAIN_FLAGS) $(LDFLAGS) $< trainer/checkpoint.c -o $@
# ---------------------------------------------------------------- end of braid-train

deps:
	@scripts/deps.sh

# The lifetime tests (destroy and abort with work still queued), the API
# calls that keep lists (registrations, windows) and the membership changes
# (shrink after a kill, grow, revoke) run a second time under AddressSanitizer
# and UBSan, built with the system compiler in $(BUILD)/san-asan/.
LIFETIME_ASAN_TESTS := mp_test_lifetime mp_test_streams mp_test_api mp_test_resize mp_test_device \
                       mp_test_device_p2p
# The build takes a job per core unless make was given -j (nvcc's two
# kernels, minutes each, then compile side by side).
BUILD_JOBS = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(shell nproc))
test: deps check-layers
	@$(MAKE) --no-print-directory $(BUILD_JOBS) all tests
	@scripts/run-tests.sh $(BUILD)
	@scripts/test-torch.sh $(BUILD)
	@SAN_CC=$(CC) SAN_BUILD_PREFIX=$(BUILD)/san SAN_SEED_BUILD=$(BUILD) \
	  SAN_TESTS="$(LIFETIME_ASAN_TESTS)" MAKE="$(MAKE)" \
	  scripts/test-sanitize.sh asan

# bindings/torch, the torch.distributed backend "braid": its tests, in a cached environment
# with torch from PyPI (scripts/torch-env.sh); and braid against gloo (perf/torch_compare.sh).
test-torch: lib
	@scripts/test-torch.sh $(BUILD)

bench-torch: lib
	@perf/torch_compare.sh $(BUILD)

run: deps
	@$(MAKE) --no-print-directory $(BUILD_JOBS) all
	@scripts/run-local.sh $(BUILD)

bench: deps
	@$(MAKE) --no-print-directory all
	@perf/compare_mpi.sh $(BUILD)

bench-shm: deps
	@$(MAKE) --no-print-directory all
	@perf/compare_shm.sh $(BUILD)

bench-cluster: deps
	@$(MAKE) --no-print-directory all
	@perf/bench_cluster.sh $(BUILD)

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/*.h $(DESTDIR)$(PREFIX)/include/
	install -m 755 $(SHLIB) $(NCCLSO) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 $(STLIB) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libnccl.so.2 $(DESTDIR)$(PREFIX)/lib/libnccl.so
	install -m 755 $(PERF_BINS) $(MPI_PERF) $(DESTDIR)$(PREFIX)/bin/
	install -m 755 $(TRAIN_BIN) $(DESTDIR)$(PREFIX)/bin/

# ---------------------------------------------------------------- sanitizers and fuzzing
# Neither is part of `make test` (but for its ASan run of LIFETIME_ASAN_TESTS,
# with the system compiler); both build with clang into their own build
# dirs (build-asan/, build-tsan/, build-fuzz/) and install clang, compiler-rt
# and llvm-symbolizer first when missing. What runs: README "Sanitizers and
# fuzzing", scripts/test-sanitize.sh, scripts/fuzz.sh.
SAN_PKGS  := clang libclang-rt-dev llvm
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRCS))

test-sanitize:
	@scripts/deps.sh $(SAN_PKGS)
	@MAKE="$(MAKE)" scripts/test-sanitize.sh

fuzz:
	@scripts/deps.sh $(SAN_PKGS)
	@MAKE="$(MAKE)" scripts/fuzz.sh

# A fuzz target is one file, tests/fuzz/fuzz_<name>.c (seeds in
# tests/fuzz/corpus/<name>/, a dictionary in tests/fuzz/<name>.dict, both
# optional). scripts/fuzz.sh builds them with BUILD=build-fuzz CC=clang and the
# fuzzer's flags; every target resolves numeric addresses only (common.c).
fuzz-targets: $(FUZZ_BINS)

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/common.c tests/fuzz/fuzz.h $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) $(LDFLAGS) -Itests/fuzz $< tests/fuzz/common.c -o $@ $(STLIB) \
	  -Wl,--wrap=getaddrinfo $(LDLIBS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

# One line per folder: "layer <folder>: <folders it may include from>".
print-layers:
	@$(foreach l,$(LAYERS),echo 'layer $(l): $(LAYER_$(l))';)

check-layers:
	@MAKE="$(MAKE)" scripts/check-layers.sh

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
