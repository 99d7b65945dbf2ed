# Braid: one entry point. `make` builds the libraries and tools,
# `make test` / `make run` install missing Debian packages first.
PREFIX ?= /usr/local
BUILD  ?= build
CC     ?= cc
MPICC  ?= mpicc

# ---------------------------------------------------------------- layers
# The folders each top-level folder may include from (docs/architecture.md, "Layers").
# A source is compiled with only its own folder's list on the include path,
# so a forbidden include does not compile; scripts/check-layers.sh (part of
# make test) checks every #include "..." against the same lists, printed by
# `make print-layers`, and names the rule a crossing breaks.
LAYERS           := common gpu kernels algorithms transports src sim perf trainer tools tests
LAYER_common     := include common
LAYER_gpu        := include common kernels gpu
LAYER_kernels    := include common kernels
LAYER_algorithms := include common algorithms
LAYER_transports := include common gpu transports
LAYER_src        := include common gpu kernels algorithms transports src
LAYER_sim        := include common gpu kernels algorithms transports src sim
LAYER_perf       := include perf
LAYER_trainer    := include trainer
LAYER_tools      := include tools
LAYER_tests      := include common gpu kernels algorithms transports src sim tests
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
# libibverbs is dlopen'ed (docs/architecture.md 5): its header is all the build needs.
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
# KERNEL_CFLAGS, where given, replaces CFLAGS for the CPU kernels alone
# (kernels/cpu): make test's ASan pass builds them without UBSan, which
# doubled their compile time (a minute per file) for tests about lifetimes.
KERNEL_CFLAGS ?=
$(BUILD)/obj/kernels/cpu/%.o: ALL_CFLAGS := $(CFLAGS_BASE) $(or $(KERNEL_CFLAGS),$(CFLAGS))
LDLIBS := -pthread -lm
# Objects list the headers they include (-MMD) and survive a header's
# removal (-MP), instead of every object depending on every header.
DEPFLAGS := -MMD -MP

# Per-file ISA flags: the dispatcher picks these at run time.
ISA_avx2   := -mavx2 -mf16c -mfma
ISA_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mf16c -mfma

# Folders that join the library only when their dependency is present; a
# build without CUDA takes the host-only sources instead (as libuv picks its
# platform files: the generic code names no device path, docs/architecture.md).
CUDA_DIRS := gpu/cuda src/cuda kernels/cuda transports/cudaipc
NOCUDA_DIRS := gpu/host src/host
IB_DIRS   := transports/ib
CUDA_SRCS := $(wildcard $(addsuffix /*.c,$(CUDA_DIRS)))
NOCUDA_SRCS := $(wildcard $(addsuffix /*.c,$(NOCUDA_DIRS)))
CUDA_CU   := $(wildcard kernels/cuda/*.cu)
IB_SRCS   := $(wildcard transports/ib/*.c)

# The CPU kernels first: the slowest C files start while there are jobs to run beside them.
LIB_SRCS := $(wildcard kernels/cpu/*.c) $(wildcard common/*.c) $(wildcard gpu/*.c) \
            $(filter-out $(addsuffix /%,$(CUDA_DIRS) $(NOCUDA_DIRS)),$(wildcard src/*/*.c)) \
            $(wildcard transports/*.c) \
            $(filter-out $(addsuffix /%,$(CUDA_DIRS) $(IB_DIRS)),$(wildcard transports/*/*.c)) \
            $(wildcard algorithms/*.c)
ifeq ($(HAVE_CUDA),1)
LIB_SRCS += $(CUDA_SRCS)
else
LIB_SRCS += $(NOCUDA_SRCS)
ifneq ($(strip $(CUDA_SRCS) $(CUDA_CU)),)
$(info CUDA parts skipped ($(CUDA_DIRS)): HAVE_CUDA=$(HAVE_CUDA), no nvcc on PATH or in CUDA_HOME=$(CUDA_HOME))
endif
endif
ifeq ($(HAVE_IBVERBS),1)
LIB_SRCS += $(IB_SRCS)
else ifneq ($(strip $(IB_SRCS)),)
$(info InfiniBand transport skipped ($(IB_DIRS)): HAVE_IBVERBS=$(HAVE_IBVERBS), <infiniband/verbs.h> does not preprocess (libibverbs-dev))
endif
LIB_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRCS))
# CUDA kernels: each .cu becomes a fatbin embedded as a byte array (the
# library loads it through the driver; it links no CUDA library).
# They come first: nvcc's runs are the longest of the build, so they start
# before the C files instead of after them.
ifeq ($(HAVE_CUDA),1)
LIB_OBJS := $(patsubst %.cu,$(BUILD)/obj/%.fatbin.o,$(CUDA_CU)) $(LIB_OBJS)
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
tools: $(PERF_BINS) $(MPI_PERF) $(BINDIR)/braid-status $(BINDIR)/braid-sim
tests: $(UNIT_BINS) $(MP_BINS)
# The sanitizer builds (scripts/test-sanitize.sh) need only these two kinds.
unit-mp-tests: $(UNIT_BINS) $(MP_BINS)

# The driver shim includes the toolkit's cuda.h (types only: it links
# nothing of CUDA); so does whatever includes the shim.
CUDA_OBJ_DIRS := gpu/cuda src/cuda transports/cudaipc
$(foreach d,$(CUDA_OBJ_DIRS),$(eval $(BUILD)/obj/$(d)/%.o: CUDA_INC := -I$(CUDA_HOME)/include))

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
	$(CC) $(ALL_CFLAGS) $(call layer_inc,$<) $(CUDA_INC) $(DEPFLAGS) -c $< -o $@

# The GPU architectures of the kernels (docs/building.md, "GPU architectures").
# CUDA_ARCHS lists compute capabilities ("80 90 100"; commas, sm_ and 9.0 work
# too): SASS for each, and the PTX of the highest for later GPUs. Unset, it is
# what the build directory was last built for, else the architectures nvidia-smi
# reports for this machine's GPUs (sm_80 and up), asked once: sub-makes inherit
# it. With no GPU it is empty, and the kernels are PTX for sm_80 alone: ptxas
# never runs here, and the driver of any GPU from sm_80 up compiles them at the
# first launch (and caches them). NVCC_ARCHS, where given, replaces the
# -gencode flags altogether. No fused multiply-add, so results match the CPU
# kernels bit for bit.
CUDA_ARCHS_FILE := $(BUILD)/cuda-archs
ifeq ($(HAVE_CUDA)$(origin CUDA_ARCHS),1undefined)
ifneq ($(wildcard $(CUDA_ARCHS_FILE)),)
CUDA_ARCHS := $(file <$(CUDA_ARCHS_FILE))
else
CUDA_ARCHS := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | \
                tr -d . | awk '$$1 ~ /^[0-9]+$$/ && $$1 >= 80')
endif
export CUDA_ARCHS
endif
comma := ,
CUDA_SM  := $(if $(filter 1,$(HAVE_CUDA)),$(shell printf '%s\n' $(subst sm_,,$(subst \
              compute_,,$(subst .,,$(subst $(comma), ,$(CUDA_ARCHS))))) | sort -un))
CUDA_PTX := $(lastword $(CUDA_SM))
ifneq ($(origin NVCC_ARCHS),undefined)
CUDA_KERNELS := what NVCC_ARCHS asks for ($(NVCC_ARCHS))
else ifneq ($(CUDA_SM),)
NVCC_ARCHS := $(foreach a,$(filter-out $(CUDA_PTX),$(CUDA_SM)),-gencode arch=compute_$(a),code=sm_$(a)) \
              -gencode arch=compute_$(CUDA_PTX),code=[sm_$(CUDA_PTX),compute_$(CUDA_PTX)]
CUDA_KERNELS := SASS for $(addprefix sm_,$(CUDA_SM)) and PTX for compute_$(CUDA_PTX)
else
NVCC_ARCHS := -gencode arch=compute_80,code=compute_80
CUDA_KERNELS := PTX for compute_80 only (no GPU here; the driver compiles it at the first launch)
endif
# nvcc builds a file's architectures side by side (0: a thread per core).
NVCC_THREADS ?= 0
NVCC_FLAGS ?= -O3 -fmad=false --threads $(NVCC_THREADS) $(NVCC_ARCHS)
# The fatbins depend on the flags that made them, so a build for other
# architectures compiles them again. The file is rewritten, as the build
# directory's architectures are, only when they change, and while the Makefile
# is read: a recipe would make nvcc, the longest job, wait behind the others.
NVCC_STAMP := $(BUILD)/obj/kernels/cuda/nvcc-flags
ifeq ($(HAVE_CUDA),1)
ifneq ($(file <$(NVCC_STAMP)),$(NVCC) $(NVCC_FLAGS))
$(shell mkdir -p $(dir $(NVCC_STAMP)))
$(file >$(NVCC_STAMP),$(NVCC) $(NVCC_FLAGS))
endif
ifneq ($(file <$(CUDA_ARCHS_FILE)),$(CUDA_ARCHS))
$(file >$(CUDA_ARCHS_FILE),$(CUDA_ARCHS))
endif
endif
$(BUILD)/obj/%.fatbin: %.cu $(NVCC_STAMP)
	@mkdir -p $(dir $@)
	@echo "nvcc: $(CUDA_KERNELS)"
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
-include $(patsubst %.c,$(BUILD)/obj/%.d,$(PERF_COMMON) $(MP_COMMON) $(filter-out \
           tests/common/cudasim%.c,$(wildcard tests/common/*.c)) $(wildcard trainer/*.c)) \
         $(BUILD)/obj/trainer/launch_mpi.d

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

# The tools' shared sources are compiled once for all of them, by the tools' compiler.
PERF_OBJS := $(patsubst perf/%.c,$(BUILD)/obj/perf/%.o,$(PERF_COMMON))
$(PERF_OBJS): $(BUILD)/obj/perf/%.o: perf/%.c Makefile
	@mkdir -p $(dir $@)
	$(PERF_CC) $(ALL_CFLAGS) $(call layer_inc,$<) $(DEPFLAGS) -fvisibility=default -c $< -o $@

$(BINDIR)/%_perf: perf/%_perf.c $(PERF_OBJS) perf/*.h $(STLIB)
	@mkdir -p $(dir $@)
	$(PERF_CC) $(ALL_CFLAGS) $(call layer_inc,$<) $(LDFLAGS) -fvisibility=default $< $(PERF_OBJS) \
	  -o $@ $(STLIB) $(LDLIBS)

# The other MPI tools (mpi_scale_probe): built the same way.
$(BINDIR)/mpi_%: perf/mpi_%.c $(PERF_OBJS) perf/*.h $(STLIB)
	@mkdir -p $(dir $@)
	$(PERF_CC) $(ALL_CFLAGS) $(call layer_inc,$<) $(LDFLAGS) -fvisibility=default $< $(PERF_OBJS) \
	  -o $@ $(STLIB) $(LDLIBS)

# braid-sim (sim/): Braid's own schedules played on a modelled cluster;
# it links the library's internals (schedules, executor keys, tuner).
SIM_SRCS := $(wildcard sim/*.c)
SIM_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(SIM_SRCS))
SIM_LIB_OBJS := $(filter-out $(BUILD)/obj/sim/main.o,$(SIM_OBJS))
-include $(SIM_OBJS:.o=.d)
$(BINDIR)/braid-sim: $(SIM_OBJS) $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) $(SIM_OBJS) -o $@ $(STLIB) $(LDLIBS)

# braid-status (tools/): the status API's command line, on the public API only.
$(BINDIR)/braid-status: tools/braid-status.c include/braid.h $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(call layer_inc,$<) $(LDFLAGS) $< -o $@ $(STLIB) $(LDLIBS)

# test_sim plays braid-sim's engine: its objects beside the library.
$(TSTDIR)/test_sim: tests/unit/test_sim.c $(SIM_LIB_OBJS) $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) $(LDFLAGS) $< -o $@ $(SIM_LIB_OBJS) $(STLIB) -lcmocka $(LDLIBS)

$(TSTDIR)/test_%: tests/unit/test_%.c $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) $(LDFLAGS) $< -o $@ $(STLIB) -lcmocka -ldl $(LDLIBS)

# test_topo checks detection against hwloc itself; the library opens hwloc
# at run time and links nothing of it.
$(TSTDIR)/test_topo: LDLIBS += -lhwloc

# The unit tests that link tests/common: the executors over the fake
# transport, both ends of a shared-memory connection in one process
# (shm_loop), and the CUDA kernel body under the CPU grid emulation (included
# as "common/...": tests/ is on their path, the repository root is not, so
# the name cannot reach the bottom common/).
UNIT_COMMON := $(filter-out tests/common/cudasim%.c,$(wildcard tests/common/*.c))
# Compiled once for every test that links them, as are tests/mp's shared sources.
UNIT_OBJS   := $(patsubst %.c,$(BUILD)/obj/%.o,$(UNIT_COMMON))
FAKE_TESTS  := $(TSTDIR)/test_schedule $(TSTDIR)/test_executor $(TSTDIR)/test_kern_cuda \
               $(TSTDIR)/test_pairwise $(TSTDIR)/test_bell $(TSTDIR)/test_shm_faults
$(FAKE_TESTS): $(TSTDIR)/test_%: tests/unit/test_%.c $(UNIT_OBJS) tests/common/*.h $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) $(LDFLAGS) $< $(UNIT_OBJS) -o $@ $(STLIB) -lcmocka -ldl $(LDLIBS)

# The simulated CUDA driver (tests/common/cudasim.c) that BRAID_CUDA_LIB
# loads where there is no GPU, and the unit tests of src/cuda, which run on it.
ifeq ($(HAVE_CUDA),1)
CUDASIM := $(TSTDIR)/libcudasim.so
$(CUDASIM): tests/common/cudasim.c tests/common/cudasim_mem.c tests/common/kern_emulate.c \
            tests/common/*.h \
            kernels/cuda/*.h kernels/kern_convert.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -Itests/common -I$(CUDA_HOME)/include -shared \
	  tests/common/cudasim.c tests/common/cudasim_mem.c tests/common/kern_emulate.c -o $@ -pthread
$(TSTDIR)/test_cuda_%: tests/unit/test_cuda_%.c $(UNIT_OBJS) tests/common/*.h $(STLIB) $(CUDASIM)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -I$(CUDA_HOME)/include $(LDFLAGS) $< $(UNIT_OBJS) -o $@ \
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

# The fake net plugin (tests/common/fakenet), one library per interface version, that
# NCCL_NET_PLUGIN names in mp_test_net.
FAKENET_VERSIONS := 8 9 10 11 12
FAKENETS := $(foreach v,$(FAKENET_VERSIONS),$(TSTDIR)/fakenet/libnccl-net-fake$(v).so)
$(TSTDIR)/fakenet/libnccl-net-fake%.so: tests/common/fakenet/fakenet.c transports/net/net_abi.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -DFAKENET_VERSION=$* -shared $< -o $@
$(TSTDIR)/mp_test_net: $(FAKENETS)
# A stand-in CUDA runtime for a real plugin that wants one at init (tests/cluster/net_plugin.sh).
FAKECUDART := $(TSTDIR)/fakecudart/libcudart.so
$(FAKECUDART): tests/common/fakecudart/fakecudart.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -shared -Wl,-soname,libcudart.so $< -o $@
tests: $(FAKECUDART)

MP_FLAGS :=
MP_OBJS  := $(patsubst %.c,$(BUILD)/obj/%.o,$(MP_COMMON))
.SECONDARY: $(MP_OBJS) $(UNIT_OBJS) # kept: a pattern rule's prerequisites are intermediate otherwise
$(TSTDIR)/mp_test_%: tests/mp/test_%.c $(MP_OBJS) tests/mp/*.h $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) $(LDFLAGS) -Itests/mp $(MP_FLAGS) $< $(MP_OBJS) -o $@ $(STLIB) \
	  -lcmocka $(LDLIBS)
$(TSTDIR)/mp_test_device $(TSTDIR)/mp_test_device_p2p $(TSTDIR)/mp_test_device_trust: $(CUDASIM)
# mp_test_deterministic runs its device-buffer variants where the simulated driver is built.
$(TSTDIR)/mp_test_deterministic: $(if $(filter 1,$(HAVE_CUDA)),$(CUDASIM))
# mp_test_status asks about a job on device buffers where the simulated driver is built.
$(TSTDIR)/mp_test_status: $(if $(filter 1,$(HAVE_CUDA)),$(CUDASIM))
# mp_test_device_trust plays a rank that lies about its buffers (cudaipc_describe
# wrapped) and strangers that speak the fd links' protocol (cuda.h's types; searched
# last: the toolkit ships NVIDIA's nccl.h, which must not stand in for Braid's).
$(TSTDIR)/mp_test_device_trust: MP_FLAGS := -idirafter $(CUDA_HOME)/include \
                                            -Wl,--wrap=cudaipc_describe
$(TSTDIR)/mp_test_ib: $(FAKEVERBS)

# mp_test_rows: a transport and an algorithm of the tests' own (tests/rows), each added by
# a row of the library's table, as docs/architecture.md says: the two tables compiled
# again with the row and linked ahead of the library, whose own copies are never pulled in.
ROWS_TABLES := $(BUILD)/obj/tests/rows/table
ROWS_OBJS   := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/rows/*.c)) \
               $(ROWS_TABLES)/transport_table.o $(ROWS_TABLES)/sched_algos.o
ROWS_CC     = @mkdir -p $(dir $@) && $(CC) $(ALL_CFLAGS) $(call layer_inc,$<) $(DEPFLAGS) -c $< -o $@
$(ROWS_TABLES)/transport_table.o: transports/transport_table.c Makefile
	$(ROWS_CC) -DBRAID_TEST_TRANSPORT=loop_transport
$(ROWS_TABLES)/sched_algos.o: algorithms/sched_algos.c Makefile
	$(ROWS_CC) -DBRAID_TEST_ALGORITHM=star_algorithm
-include $(ROWS_OBJS:.o=.d)
$(TSTDIR)/mp_test_rows: $(ROWS_OBJS)
$(TSTDIR)/mp_test_rows: MP_FLAGS := -Itests/rows $(ROWS_OBJS)

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

# The sources are compiled once for braid-train and its tests; launch.c twice, as it
# speaks MPI in braid-train (built with mpicc) and not in the tests.
TRAIN_OBJS  := $(patsubst %.c,$(BUILD)/obj/%.o,$(TRAIN_SRCS))
TRAIN_MPI   := $(BUILD)/obj/trainer/launch_mpi.o
$(TRAIN_OBJS): $(BUILD)/obj/trainer/%.o: trainer/%.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(TRAIN_FLAGS) $(DEPFLAGS) -c $< -o $@
$(TRAIN_MPI): trainer/launch.c Makefile
	@mkdir -p $(dir $@)
	$(TRAIN_CC) $(TRAIN_FLAGS) $(DEPFLAGS) -c $< -o $@

$(TRAIN_BIN): trainer/main.c $(TRAIN_OBJS) $(TRAIN_MPI) $(TRAIN_HDRS) $(STLIB)
	@mkdir -p $(dir $@)
	$(TRAIN_CC) $(TRAIN_FLAGS) $(LDFLAGS) trainer/main.c $(filter-out %/launch.o,$(TRAIN_OBJS)) \
	  $(TRAIN_MPI) -o $@ $(STLIB) $(TRAIN_LIBS) $(LDLIBS)

$(TSTDIR)/test_trainer_%: tests/trainer/test_trainer_%.c $(TRAIN_OBJS) $(TRAIN_HDRS) $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(TRAIN_FLAGS) $(LDFLAGS) $< $(TRAIN_OBJS) -o $@ $(STLIB) -lcmocka $(TRAIN_LIBS) $(LDLIBS)

$(TSTDIR)/trainer_ckpt_diff: tests/trainer/ckpt_diff.c $(BUILD)/obj/trainer/checkpoint.o $(TRAIN_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(TRAIN_FLAGS) $(LDFLAGS) $< $(BUILD)/obj/trainer/checkpoint.o -o $@
# ---------------------------------------------------------------- end of braid-train

deps:
	@scripts/deps.sh

# The lifetime tests (destroy and abort with work still queued), the API
# calls that keep lists (registrations, windows), the membership changes
# (shrink after a kill, grow, revoke), teardown while a call waits
# (mp_test_hardening) and a shared-memory peer that writes its segment
# wrongly or dies (test_shm_faults, mp_test_hardening_shm: nothing may be
# touched outside the ring) run a second time under AddressSanitizer and UBSan,
# built with the system compiler in $(BUILD)/san-asan/.
# Their CPU kernels get ASan without UBSan (make test-sanitize has both).
LIFETIME_KERNEL_FLAGS := -O1 -g -fsanitize=address -fno-omit-frame-pointer
LIFETIME_ASAN_TESTS := mp_test_lifetime mp_test_streams mp_test_api mp_test_resize mp_test_device \
                       mp_test_device_p2p mp_test_hardening mp_test_hardening_shm test_shm_faults
# The build takes a job per core unless make was given -j (nvcc's two
# kernels, minutes each, then compile side by side).
BUILD_JOBS = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(shell nproc))
# MP_BIG_COUNT: mp_test_device's matrix at 20003 elements, not 200003 (its
# lifetime cases keep their sizes; the full matrix ran in the C tests).
LIFETIME_ASAN := SAN_CC=$(CC) SAN_BUILD_PREFIX=$(BUILD)/san SAN_SEED_BUILD=$(BUILD) \
  SAN_TESTS="$(LIFETIME_ASAN_TESTS)" MAKE="$(MAKE)" SAN_KERNEL_FLAGS="$(LIFETIME_KERNEL_FLAGS)" \
  MP_BIG_COUNT=20003
# The torch environment and package, and the ASan build, are made in the
# background, niced, while the C tests run: they take the CPU those leave.
test: deps check-layers
	@$(MAKE) --no-print-directory $(BUILD_JOBS) all tests
	@scripts/check-links.sh
	@scripts/check-deps.py $(BUILD)
	@scripts/check-walk.sh $(BUILD)
	@MAX_JOBS=1 nice -n 10 scripts/test-torch.sh prepare $(BUILD) >$(BUILD)/torch-prepare.log 2>&1 & \
	  prep=$$!; \
	  $(LIFETIME_ASAN) SAN_BUILD_ONLY=1 nice -n 10 scripts/test-sanitize.sh asan \
	    >$(BUILD)/asan-build.log 2>&1 & \
	  san=$$!; scripts/run-tests.sh $(BUILD); rc=$$?; \
	  wait $$prep || { cat $(BUILD)/torch-prepare.log; echo "test-torch: preparing failed"; }; \
	  [ $$rc = 0 ] && scripts/test-torch.sh $(BUILD); rc2=$$?; \
	  wait $$san || tail -40 $(BUILD)/asan-build.log; \
	  [ $$rc = 0 ] && [ $$rc2 = 0 ]
	@$(LIFETIME_ASAN) scripts/test-sanitize.sh asan

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

# A release build names its GPU architectures (docs/building.md):
#   make CUDA_ARCHS="80 90 100" install PREFIX=/opt/braid
install: all
ifeq ($(HAVE_CUDA),1)
	@echo "install: CUDA kernels: $(CUDA_KERNELS)"
	@$(if $(CUDA_SM),true,echo 'install: for SASS, a release build: make CUDA_ARCHS="80 90 100" install')
endif
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/*.h $(DESTDIR)$(PREFIX)/include/
	install -m 755 $(SHLIB) $(NCCLSO) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 $(STLIB) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libnccl.so.2 $(DESTDIR)$(PREFIX)/lib/libnccl.so
	install -m 755 $(PERF_BINS) $(MPI_PERF) $(BINDIR)/braid-status $(DESTDIR)$(PREFIX)/bin/
	install -m 755 $(TRAIN_BIN) $(DESTDIR)$(PREFIX)/bin/

# ---------------------------------------------------------------- sanitizers and fuzzing
# Neither is part of `make test` (but for its ASan run of LIFETIME_ASAN_TESTS,
# with the system compiler); both build with clang into their own build
# dirs (build-asan/, build-tsan/, build-fuzz/) and install clang, compiler-rt
# and llvm-symbolizer first when missing. What runs: docs/building.md, "Sanitizers and
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
	rm -rf $(BUILD) build-asan build-tsan build-fuzz build-gpu
