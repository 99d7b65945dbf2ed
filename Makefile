# Braid: one entry point. `make` builds the libraries and tools,
# `make test` / `make run` install missing Debian packages first.
PREFIX ?= /usr/local
BUILD  ?= build
CC     ?= cc
MPICC  ?= mpicc

CFLAGS_BASE := -std=c11 -O2 -g -Wall -Wextra -fPIC -fvisibility=hidden \
               -D_GNU_SOURCE -ffp-contract=off -pthread \
               -Iinclude -Isrc -Itransports -Ialgorithms -Ikernels
CFLAGS ?=
LDFLAGS ?=
ALL_CFLAGS := $(CFLAGS_BASE) $(CFLAGS)
LDLIBS := -pthread -lm -lhwloc

# Per-file ISA flags: the dispatcher picks these at run time.
ISA_avx2   := -mavx2 -mf16c -mfma
ISA_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mf16c -mfma

LIB_SRCS := $(wildcard src/*.c) $(wildcard transports/*.c) $(wildcard transports/*/*.c) \
            $(wildcard algorithms/*.c) $(wildcard kernels/cpu/*.c)
LIB_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRCS))
HDRS     := $(wildcard include/*.h src/*.h transports/*.h transports/*/*.h algorithms/*.h kernels/*.h kernels/cpu/*.h)

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

UNIT_SRCS  := $(wildcard tests/unit/test_*.c)
UNIT_BINS  := $(patsubst tests/unit/%.c,$(TSTDIR)/%,$(UNIT_SRCS))
MP_COMMON  := $(filter-out tests/mp/test_%.c,$(wildcard tests/mp/*.c))
MP_SRCS    := $(wildcard tests/mp/test_*.c)
MP_BINS    := $(patsubst tests/mp/%.c,$(TSTDIR)/mp_%,$(MP_SRCS))

.PHONY: all lib tools tests unit-mp-tests test run bench bench-shm bench-cluster install clean \
        deps format test-sanitize fuzz fuzz-targets
all: lib tools

lib: $(SHLIB) $(STLIB) $(NCCLSO) $(LIBDIR)/libnccl.so
tools: $(PERF_BINS) $(MPI_PERF)
tests: $(UNIT_BINS) $(MP_BINS)
# The sanitizer builds (scripts/test-sanitize.sh) need only these two kinds.
unit-mp-tests: $(UNIT_BINS) $(MP_BINS)

$(BUILD)/obj/%_avx2.o: %_avx2.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(ISA_avx2) -c $< -o $@

$(BUILD)/obj/%_avx512.o: %_avx512.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(ISA_avx512) -c $< -o $@

$(BUILD)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

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
	$(PERF_CC) $(ALL_CFLAGS) $(LDFLAGS) -fvisibility=default $< $(PERF_COMMON) -o $@ $(STLIB) $(LDLIBS)

$(TSTDIR)/test_%: tests/unit/test_%.c $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -Itests $< -o $@ $(STLIB) -lcmocka -ldl $(LDLIBS)

# The unit tests that run executors over the fake transport link tests/common.
UNIT_COMMON := $(wildcard tests/common/*.c)
FAKE_TESTS  := $(TSTDIR)/test_schedule $(TSTDIR)/test_executor
$(FAKE_TESTS): $(TSTDIR)/test_%: tests/unit/test_%.c $(UNIT_COMMON) tests/common/*.h $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -Itests $< $(UNIT_COMMON) -o $@ $(STLIB) -lcmocka -ldl $(LDLIBS)

$(TSTDIR)/mp_test_%: tests/mp/test_%.c $(MP_COMMON) tests/mp/*.h $(STLIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -Itests -Itests/mp $< $(MP_COMMON) -o $@ $(STLIB) -lcmocka $(LDLIBS)

# ---------------------------------------------------------------- braid-train (trainer/)
# Data-parallel SGD on Fashion-MNIST. Built with mpicc when Open MPI is present: under mpirun
# MPI only broadcasts the unique id; gradients always go through Braid. Its tests link the
# same sources (without MPI) and run from scripts/run-tests.sh: build/tests/test_trainer_*
# and tests/trainer/*.sh, which uses build/tests/trainer_ckpt_diff.
TRAIN_SRCS  := $(filter-out trainer/main.c,$(wildcard trainer/*.c))
TRAIN_HDRS  := $(wildcard trainer/*.h)
TRAIN_BIN   := $(BINDIR)/braid-train
TRAIN_LIBS  := -lopenblas -lz
TRAIN_FLAGS := $(ALL_CFLAGS) -O3 -Itrainer # -O3: the element-wise loops vectorize (exactly)
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

# The lifetime tests (destroy and abort with work still queued) run a second
# time under AddressSanitizer, built with the system compiler in build-asan/.
LIFETIME_ASAN_TESTS := mp_test_lifetime mp_test_streams
test: deps
	@$(MAKE) --no-print-directory all tests
	@scripts/run-tests.sh $(BUILD)
	@SAN_CC=$(CC) SAN_TESTS="$(LIFETIME_ASAN_TESTS)" MAKE="$(MAKE)" scripts/test-sanitize.sh asan

run: deps
	@$(MAKE) --no-print-directory all
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
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -Itests/fuzz $< tests/fuzz/common.c -o $@ $(STLIB) \
	  -Wl,--wrap=getaddrinfo $(LDLIBS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
