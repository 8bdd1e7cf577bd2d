# Makefile — dtensor (GNU make >= 4.2: uses $(file <...)).
#
#   make              library, examples, bench and (if cmocka is found) tests
#   make test         build and run the cmocka suites (tests/run_tests.sh)
#   make run          build, then train a small model (build/examples/train_gpt)
#   make install      headers, libraries, dtensor.pc and the CMake package
#                     (lib/cmake/dtensor) under $(DESTDIR)$(PREFIX); as root
#                     with DESTDIR empty, then ldconfig
#   make help         targets and variables
#
# Dependencies are found by try-compile probes only (never by asking a
# package manager); scripts/deps.sh installs cmocka, OpenBLAS, CMake (for a
# test) and (unless MPI=0) Open MPI first when they are missing. In this
# file always use $(shell ...): $(cmd ...) is not a make function and
# silently expands to nothing.

# ---------------------------------------------------------------------------
# Options (override on the command line: make CUDA=0 DEBUG=1 ...)
# ---------------------------------------------------------------------------
CC            ?= cc
CUDA_HOME     ?= /usr/local/cuda
NCCL_HOME     ?=
CMOCKA_ROOT   ?=
OPENBLAS_ROOT ?=
MPI_HOME      ?=
PREFIX        ?= /usr/local
DESTDIR       ?=
CUDA          ?= auto
MPI           ?= auto
SANITIZE      ?=
DEBUG         ?=
DEPS          ?= auto
NVCC_ARCH     ?= sm_90
SPILL_CHECK   ?= 1
LINEINFO      ?= 0
WGMMA_NARROW  ?= 1
VERSION       ?= 0.1.0
# Extra user flags, appended after ours (so CFLAGS=-O3 wins over -O2).
CFLAGS        ?=
CPPFLAGS      ?=
LDFLAGS       ?=
LDLIBS        ?=

# SANITIZE=1 is short for the usual pair; 0 or empty means off.
ifeq ($(SANITIZE),1)
override SANITIZE := address,undefined
endif
ifeq ($(SANITIZE),0)
override SANITIZE :=
endif
DEBUG_ON := $(filter 1 yes,$(DEBUG))

# CUDA=emu: the CUDA backend built from the same sources by the host C++
# compiler, against the CPU emulator of tests/emu (emulated CUDA runtime and
# cuBLAS, NCCL with ranks as threads, kernels on fibers), so every CUDA code
# path, the NCCL transport included, runs on a machine without a GPU. For
# testing only: slow (each test binary may take 1200 s unless
# DT_TEST_TIMEOUT says otherwise); stream work runs when the host waits.
EMU_ON := $(filter emu,$(CUDA))

# Each variant gets its own tree so objects built with different flags never
# mix: build/, build-debug/, build-san/, build-emu/, build-emu-debug-san/,
# build-tsan/ (SANITIZE=thread), build-lineinfo/ (LINEINFO=1), ...
BUILD := build$(if $(EMU_ON),-emu)$(if $(DEBUG_ON),-debug)$(if $(SANITIZE),$(if $(findstring thread,$(SANITIZE)),-tsan,-san))$(if $(filter 1,$(LINEINFO)),-lineinfo)

# ---------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------
# The library's layers, lowest first (tests/test_layers.c keeps includes to this order).
LIB_DIRS     := base collectives dtensor attention attention/cuda
LIB_SRCS     := $(sort $(wildcard $(addsuffix /*.c,$(LIB_DIRS))))
EXAMPLE_SRCS := $(sort $(wildcard examples/*.c))
BENCH_SRCS   := $(sort $(wildcard bench/*.c))
TEST_SRCS    := $(sort $(wildcard tests/test_*.c))
# tests/*.c that are not tests (harness.c, ...) are linked into every test.
TEST_HELPER_SRCS := $(filter-out $(TEST_SRCS),$(sort $(wildcard tests/*.c)))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
LIB_OBJS         := $(call obj,$(LIB_SRCS))
EXAMPLE_OBJS     := $(call obj,$(EXAMPLE_SRCS))
BENCH_OBJS       := $(call obj,$(BENCH_SRCS))
TEST_OBJS        := $(call obj,$(TEST_SRCS))
TEST_HELPER_OBJS := $(call obj,$(TEST_HELPER_SRCS))

LIB_A := $(BUILD)/lib/libdtensor.a
LIB_SO := $(BUILD)/lib/libdtensor.so
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRCS))
BENCHES  := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
TESTS    := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
# `make install` into the build tree, for tests/test_docs.c (see install).
STAGE    := $(abspath $(BUILD))/stage
STAGE_PC := $(STAGE)/lib/pkgconfig/dtensor.pc

# Headers that `make install` leaves out: the ones named here, and any whose
# first comment line says PRIVATE. Recursive (=) so the greps run only for
# install and its stage (make test).
ALL_HEADERS := $(sort $(wildcard $(addsuffix /*.h,$(LIB_DIRS))))
PRIVATE_HEADERS = dtensor/backend.h dtensor/context_internal.h \
    collectives/transport.h collectives/transport_local.h \
    $(shell for f in $(ALL_HEADERS); do \
        grep -m1 -E '^[[:space:]]*(/\*|//)' $$f | grep -q PRIVATE && echo $$f; \
    done)
PUBLIC_HEADERS = $(filter-out $(PRIVATE_HEADERS),$(ALL_HEADERS))

# ---------------------------------------------------------------------------
# Dependencies and probes. Skipped for goals that build nothing.
# ---------------------------------------------------------------------------
NOPROBE_GOALS := clean help
PROBE := $(if $(MAKECMDGOALS),$(if $(filter-out $(NOPROBE_GOALS),$(MAKECMDGOALS)),1),1)

# Literal # and , for use inside function calls.
H := \#
, := ,
MULTIARCH := $(or $(shell $(CC) -print-multiarch 2>/dev/null),x86_64-linux-gnu)

# Existing directories among $(1).
dirs_that_exist = $(patsubst %/.,%,$(wildcard $(addsuffix /.,$(1))))
# -I/-L/-rpath flags for a prefix ROOT ($(1)) such as unpacked .debs in
# /x/usr: include/, lib/ and lib/<multiarch>/, plus subdirectories $(2) of
# each (Debian keeps the real OpenBLAS files in .../openblas-pthread/).
root_flags = $(addprefix -I,$(call dirs_that_exist,$(1)/include $(1)/include/$(MULTIARCH) \
        $(foreach s,$(2),$(1)/include/$(s) $(1)/include/$(MULTIARCH)/$(s)))) \
    $(foreach d,$(call dirs_that_exist,$(1)/lib $(1)/lib/$(MULTIARCH) \
        $(foreach s,$(2),$(1)/lib/$(s) $(1)/lib/$(MULTIARCH)/$(s))),-L$(d) -Wl,-rpath,$(d))

# $(call probe,SOURCE,LIBS,CANDIDATES,HEADER,LIBNAME): write SOURCE (\n for
# newlines, $(H) for #, no single quotes) to a temporary file and compile and
# link it with each candidate flag set in turn (CANDIDATES: shell words, one
# quoted string per set; pass it as a variable since flags contain commas).
# Prints "ok HEADER-PATH LIB-PATH FLAGS..." for the first that works (paths
# are "-" when unknown), nothing if none does. Implicit declarations are
# errors so a cblas.h from another BLAS cannot pass for OpenBLAS's.
PROBE_CFLAGS := -std=c11 -D_POSIX_C_SOURCE=200809L -Werror=implicit-function-declaration
probe = $(shell d=$$(mktemp -d) || exit 0; printf '%b\n' '$(1)' >$$d/p.c; \
    for f in $(3); do \
        if $(CC) $(PROBE_CFLAGS) $$f $$d/p.c -o $$d/p $(2) >/dev/null 2>&1; then \
            h=$$($(CC) $(PROBE_CFLAGS) $$f -M $$d/p.c 2>/dev/null | tr ' \\' '\n\n' | grep -m1 '/$(4)$$'); \
            l=$$(ldd $$d/p 2>/dev/null | awk '/$(5)/ { print $$3; exit }'); \
            echo "ok $${h:--} $${l:--} $$f"; break; \
        fi; \
    done; rm -rf $$d)
probe_ok     = $(filter ok,$(firstword $(1)))
probe_header = $(word 2,$(1))
probe_lib    = $(word 3,$(1))
probe_flags  = $(wordlist 4,999,$(1))

SRC_CMOCKA := $(H)include <stdarg.h>\n$(H)include <stddef.h>\n$(H)include <stdint.h>\n$(H)include <setjmp.h>\n$(H)include <cmocka.h>\nstatic void t(void **s) { (void)s; }\nint main(void) { const struct CMUnitTest ts[] = { cmocka_unit_test(t) }; return cmocka_run_group_tests(ts, NULL, NULL); }
SRC_OPENBLAS := $(H)include <cblas.h>\nint main(void) { float a = 1, b = 2, c = 0; openblas_set_num_threads(1); cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1); return c != 2.0f; }
SRC_CUBLAS := $(H)include <cuda_runtime_api.h>\n$(H)include <cublas_v2.h>\nint main(void) { cublasHandle_t h; int n = 0; if (cudaGetDeviceCount(&n) == cudaSuccess && n < 0) cublasCreate(&h); return 0; }
SRC_NCCL := $(H)include <nccl.h>\nint main(void) { int v = 0; return ncclGetVersion(&v) != ncclSuccess; }
SRC_MPI := $(H)include <mpi.h>\nint main(int argc, char **argv) { MPI_Init(&argc, &argv); return MPI_Finalize(); }

ifeq ($(PROBE),1)

# 1. Install what is missing (stderr passes through; stdout is discarded).
# MPI comes through the same path unless MPI=0 (then it is never installed).
ifneq ($(DEPS),0)
DEPS_STATUS := $(shell CC='$(CC)' CMOCKA_ROOT='$(CMOCKA_ROOT)' OPENBLAS_ROOT='$(OPENBLAS_ROOT)' \
    MPI_HOME='$(MPI_HOME)' $(SHELL) scripts/deps.sh $(if $(filter 0,$(MPI)),--without-mpi) >&2; echo $$?)
endif

# 2. Required: OpenBLAS. Plain search path first, then Debian's and Fedora's
# private directories; OPENBLAS_ROOT, when given, before all of them.
OB_CANDIDATES := $(if $(OPENBLAS_ROOT),"$(call root_flags,$(OPENBLAS_ROOT),openblas-pthread openblas)") \
    "" "-I/usr/include/$(MULTIARCH)/openblas-pthread -L/usr/lib/$(MULTIARCH)/openblas-pthread" \
    "-I/usr/include/openblas"
OPENBLAS_PROBE := $(call probe,$(SRC_OPENBLAS),-lopenblas,$(OB_CANDIDATES),cblas.h,libopenblas)
ifeq ($(call probe_ok,$(OPENBLAS_PROBE)),)
$(error OpenBLAS not found (cblas.h + -lopenblas): apt-get install libopenblas-dev, or make OPENBLAS_ROOT=<prefix>)
endif

# 3. cmocka: tests only. CMOCKA_ROOT adds to the default search path.
CM_CANDIDATES := "$(if $(CMOCKA_ROOT),$(call root_flags,$(CMOCKA_ROOT)))"
CMOCKA_PROBE := $(call probe,$(SRC_CMOCKA),-lcmocka,$(CM_CANDIDATES),cmocka.h,libcmocka)
HAVE_CMOCKA := $(call probe_ok,$(CMOCKA_PROBE))

# 4. CUDA toolkit, cuBLAS, NCCL. The CUDA backend needs nvcc and cuBLAS; the
# NCCL transport needs NCCL as well.
CUDA_LIBDIR := $(firstword $(call dirs_that_exist,$(CUDA_HOME)/lib64 $(CUDA_HOME)/lib))
CUDA_FLAGS := -I$(CUDA_HOME)/include $(if $(CUDA_LIBDIR),-L$(CUDA_LIBDIR) -Wl$(,)-rpath$(,)$(CUDA_LIBDIR))
ifneq ($(EMU_ON),)
HAVE_CUDA := emu
HAVE_CUBLAS := emu
HAVE_NCCL := emu
else ifneq ($(CUDA),0)
NVCC := $(CUDA_HOME)/bin/nvcc
NVCC_VERSION := $(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
HAVE_CUDA := $(if $(NVCC_VERSION),ok)
CUBLAS_PROBE := $(if $(HAVE_CUDA),$(call probe,$(SRC_CUBLAS),-lcublas -lcudart,"$(CUDA_FLAGS)",cublas_v2.h,libcublas))
NCCL_CANDIDATES := $(if $(NCCL_HOME),"$(call root_flags,$(NCCL_HOME)) $(CUDA_FLAGS)") "$(CUDA_FLAGS)"
NCCL_PROBE := $(if $(HAVE_CUDA),$(call probe,$(SRC_NCCL),-lnccl -lcudart,$(NCCL_CANDIDATES),nccl.h,libnccl))
HAVE_CUBLAS := $(call probe_ok,$(CUBLAS_PROBE))
HAVE_NCCL := $(call probe_ok,$(NCCL_PROBE))
ifeq ($(CUDA)$(HAVE_CUDA),1)
$(error CUDA=1 but no working nvcc at $(NVCC) (set CUDA_HOME))
endif
ifeq ($(CUDA)$(HAVE_CUBLAS),1)
$(error CUDA=1 but cuBLAS (cublas_v2.h + -lcublas) is not usable under $(CUDA_HOME))
endif
endif

# 5. A host C++ compiler, for the tests only: test_mma_emu runs the
# tensor-core kernels' sources, compiled by it, on the CPU emulator of
# tests/emu. Without one that suite reports its cases skipped.
CXX_VERSION := $(shell $(CXX) -dumpfullversion -dumpversion 2>/dev/null | head -n1)
HAVE_CXX := $(if $(CXX_VERSION),ok)

# 6. MPI: mpicc from MPI_HOME/bin or PATH. Our sources are compiled with
# $(CC), not mpicc: the wrapper says which flags it adds (Open MPI:
# --showme:compile / --showme:link; MPICH: -show), and a try-compile with
# $(CC) and those flags decides.
ifneq ($(MPI),0)
MPICC := $(if $(MPI_HOME),$(MPI_HOME)/bin/mpicc,$(shell command -v mpicc 2>/dev/null))
MPI_SHOW_COMPILE := $(if $(MPICC),$(shell $(MPICC) --showme:compile 2>/dev/null))
MPI_SHOW_LINK := $(if $(MPICC),$(shell $(MPICC) --showme:link 2>/dev/null))
MPI_SHOW := $(if $(MPICC),$(if $(MPI_SHOW_COMPILE)$(MPI_SHOW_LINK),,$(shell $(MPICC) -show 2>/dev/null)))
MPI_CPPFLAGS := $(filter -I% -D%,$(MPI_SHOW_COMPILE) $(MPI_SHOW))
MPI_LIBDIRS := $(patsubst -L%,%,$(filter -L%,$(MPI_SHOW_LINK) $(MPI_SHOW)))
MPI_LIBS := $(filter -L% -l% -Wl%,$(MPI_SHOW_LINK) $(MPI_SHOW)) \
    $(foreach d,$(MPI_LIBDIRS),-Wl$(,)-rpath$(,)$(d))
MPI_PROBE := $(if $(MPICC),$(call probe,$(SRC_MPI),$(MPI_LIBS),"$(MPI_CPPFLAGS)",mpi.h,libmpi))
HAVE_MPI := $(call probe_ok,$(MPI_PROBE))
MPIRUN := $(if $(MPI_HOME),$(MPI_HOME)/bin/mpirun,$(shell command -v mpirun 2>/dev/null))
ifeq ($(MPI)$(HAVE_MPI),1)
$(error MPI=1 but no working mpicc ($(or $(MPICC),none in PATH); set MPI_HOME, or scripts/deps.sh))
endif
endif

endif # PROBE

# ---------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------
OPENBLAS_FLAGS := $(call probe_flags,$(OPENBLAS_PROBE))
CMOCKA_FLAGS   := $(call probe_flags,$(CMOCKA_PROBE))
# A *_ROOT prefix may lack the libraries its libraries need (libgfortran
# for OpenBLAS); old-style DT_RPATH, unlike RUNPATH, also serves those.
ROOT_LDFLAGS := $(if $(CMOCKA_ROOT)$(OPENBLAS_ROOT),-Wl$(,)--disable-new-dtags)

OPT_CFLAGS := $(if $(DEBUG_ON),-O0 -g3,-O2 -g)
WARN_CFLAGS := -Wall -Wextra -Werror -Wshadow
SAN_FLAGS := $(if $(SANITIZE),-fsanitize=$(SANITIZE) -fno-sanitize-recover=all -fno-omit-frame-pointer)

# WGMMA_NARROW=0 compiles the wgmma forward's narrow tiles out
# (attention/cuda/kernels.h), in the kernels and in the tests that count
# their instructions alike; for measuring the kernel without them.
KERNEL_DEFS := $(if $(filter 0,$(WGMMA_NARROW)),-DDT_WGMMA_NARROW=0)
DT_CPPFLAGS := -I. -D_POSIX_C_SOURCE=200809L $(if $(DEBUG_ON),-DDT_DEBUG) $(KERNEL_DEFS) \
    $(filter -I%,$(OPENBLAS_FLAGS)) $(CPPFLAGS)
DT_CFLAGS := -std=c11 $(OPT_CFLAGS) $(WARN_CFLAGS) -pthread -fPIC $(SAN_FLAGS) $(CFLAGS)
DT_LDFLAGS := -pthread $(SAN_FLAGS) $(filter-out -I%,$(OPENBLAS_FLAGS)) $(ROOT_LDFLAGS) $(LDFLAGS)
DT_LDLIBS := -lopenblas -lm -pthread $(LDLIBS)
TEST_CPPFLAGS := $(filter -I%,$(CMOCKA_FLAGS))
TEST_LDFLAGS := $(filter-out -I%,$(CMOCKA_FLAGS))
# The host C++ compiler's flags for CUDA sources run on the CPU emulator
# (tests/emu: test_mma_emu, and CUDA=emu). -Wno-psabi silences GCC's note
# that version 4.6 changed how 128-byte aligned arguments (a CUtensorMap)
# are passed.
EMU_CXXFLAGS := -std=c++17 $(OPT_CFLAGS) -Wall -Wextra -Werror -Wno-unknown-pragmas -Wno-psabi \
    -fno-strict-aliasing -ffp-contract=off -fno-exceptions -fno-rtti -fno-threadsafe-statics \
    -fPIC -pthread $(SAN_FLAGS) $(KERNEL_DEFS) \
    -DDT_CUDA_EMULATE -Itests/emu/include -Itests/emu -I. $(filter -I%,$(OPENBLAS_FLAGS))

# --- CUDA hook --------------------------------------------------------------
# With CUDA enabled and nvcc + cuBLAS found, the .cu files beside the C
# sources are compiled with nvcc into the library and DT_HAVE_CUDA is defined
# for all C code; the CUDA runtime directory goes into every binary's rpath.
# With NCCL found as well, collectives/transport_nccl.c is built and
# DT_HAVE_NCCL defined; otherwise that file is left out. One GPU
# architecture (NVCC_ARCH, sm_90 by default; sm_80 for A100) keeps nvcc fast.
NCCL_SRCS := collectives/transport_nccl.c
CU_SRCS := $(if $(and $(HAVE_CUDA),$(HAVE_CUBLAS)),$(sort $(wildcard $(addsuffix /*.cu,$(LIB_DIRS)))))
BUILD_NCCL := $(if $(CU_SRCS),$(HAVE_NCCL))
ifeq ($(BUILD_NCCL),)
LIB_OBJS := $(filter-out $(call obj,$(NCCL_SRCS)),$(LIB_OBJS))
endif
ifneq ($(EMU_ON),)
CU_OBJS := $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CU_SRCS))
LIB_OBJS += $(CU_OBJS) $(BUILD)/obj/tests/emu/runtime.o $(BUILD)/obj/tests/emu/cudart.o \
    $(BUILD)/obj/tests/emu/nccl.o
DT_CPPFLAGS += -DDT_HAVE_CUDA -DDT_CUDA_EMULATE -DDT_HAVE_NCCL -Itests/emu/include
else ifneq ($(CU_SRCS),)
CU_OBJS := $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CU_SRCS))
LIB_OBJS += $(CU_OBJS)
DT_CPPFLAGS += -DDT_HAVE_CUDA -I$(CUDA_HOME)/include
DT_LDFLAGS += $(filter-out -I%,$(CUDA_FLAGS))
DT_LDLIBS += -lcublas -lcudart
# No exceptions, RTTI or thread-safe statics: the objects need no C++ runtime,
# so C programs link the library with cc alone.
# LINEINFO=1: nvcc -lineinfo, the device code's source lines for Nsight
# Compute's source page (bench/ncu_source.py); the code is the same. Off by
# default: every program links the library's kernels, and with their line
# tables scripts/gpu_pack.sh's programs weigh 79 MiB instead of 39, over
# what a device call carries (64 MiB).
NVCC_FLAGS := -std=c++17 $(if $(DEBUG_ON),-O0 -g -G,-O2 -g) $(if $(filter 1,$(LINEINFO)),-lineinfo) \
    -Xcompiler -fPIC,-Wall,-Wextra,-Werror,-fno-exceptions,-fno-rtti,-fno-threadsafe-statics \
    -Werror all-warnings -I. -DDT_HAVE_CUDA $(KERNEL_DEFS) \
    $(if $(BUILD_NCCL),-DDT_HAVE_NCCL) $(if $(DEBUG_ON),-DDT_DEBUG)
ifneq ($(BUILD_NCCL),)
NCCL_FLAGS := $(call probe_flags,$(NCCL_PROBE))
DT_CPPFLAGS += -DDT_HAVE_NCCL $(filter-out -I$(CUDA_HOME)/include,$(filter -I%,$(NCCL_FLAGS)))
DT_LDFLAGS += $(filter-out $(CUDA_FLAGS),$(filter-out -I%,$(NCCL_FLAGS)))
DT_LDLIBS := -lnccl $(DT_LDLIBS)
endif
endif

# --- MPI hook ---------------------------------------------------------------
# With MPI found, collectives/transport_mpi.c is built (the only file that
# includes mpi.h, so only it gets MPI's include flags), DT_HAVE_MPI is
# defined, and MPI's libraries are linked into the library and programs.
MPI_SRCS := collectives/transport_mpi.c
ifeq ($(HAVE_MPI),)
LIB_OBJS := $(filter-out $(call obj,$(MPI_SRCS)),$(LIB_OBJS))
else
DT_CPPFLAGS += -DDT_HAVE_MPI
DT_LDLIBS := $(MPI_LIBS) $(DT_LDLIBS)
$(call obj,$(MPI_SRCS)): DT_CPPFLAGS += $(MPI_CPPFLAGS)
endif

# Every object depends on this file, rewritten only when the compiler or the
# flags change, so `make CC=clang` or CUDA=0 after a build recompiles instead
# of linking stale objects.
STAMP := $(BUILD)/.flags
FLAGS_SIG := $(CC) $(CXX) $(EMU_CXXFLAGS) | $(DT_CPPFLAGS) | $(DT_CFLAGS) | $(DT_LDFLAGS) | $(DT_LDLIBS) | \
    $(TEST_CPPFLAGS) $(TEST_LDFLAGS) | $(CU_SRCS) $(NVCC_ARCH) $(NVCC_FLAGS) $(SPILL_CHECK) | $(MPI_CPPFLAGS)
ifeq ($(PROBE),1)
ifneq ($(FLAGS_SIG),$(file <$(STAMP)))
$(shell mkdir -p $(BUILD))
$(file >$(STAMP),$(FLAGS_SIG))
endif
endif

# ---------------------------------------------------------------------------
# Summary, printed once per make invocation (at parse time)
# ---------------------------------------------------------------------------
found = $(if $(1),found    ,not found)
names = $(if $(1),$(notdir $(1)),none)
ifeq ($(PROBE),1)
_ :=
CC_VERSION := $(shell $(CC) -dumpfullversion -dumpversion 2>/dev/null | head -n1)
$(info dtensor $(VERSION): configuration (make help lists the options))
$(info $(_)  compiler  $(CC) $(CC_VERSION), $(OPT_CFLAGS)$(if $(SANITIZE), -fsanitize=$(SANITIZE))$(if $(DEBUG_ON), -DDT_DEBUG); output in $(BUILD)/)
$(info $(_)  OpenBLAS  $(call found,ok) $(call probe_header,$(OPENBLAS_PROBE)) ($(call probe_lib,$(OPENBLAS_PROBE))))
$(info $(_)  cmocka    $(call found,$(HAVE_CMOCKA)) $(if $(HAVE_CMOCKA),$(call probe_header,$(CMOCKA_PROBE)) ($(call probe_lib,$(CMOCKA_PROBE))),apt-get install libcmocka-dev (or CMOCKA_ROOT=<prefix>)))
ifeq ($(CUDA),0)
$(info $(_)  CUDA      disabled (CUDA=0); cuBLAS and NCCL not probed)
else ifneq ($(EMU_ON),)
$(info $(_)  CUDA      EMULATED (CUDA=emu): $(words $(CU_SRCS)) .cu file(s) by $(CXX) on the CPU emulator of tests/emu; NCCL emulated too (ranks as threads): NCCL transport built)
else
$(info $(_)  CUDA      $(call found,$(HAVE_CUDA)) $(if $(HAVE_CUDA),$(CUDA_HOME) (nvcc $(NVCC_VERSION))$(if $(CU_SRCS),; CUDA backend: $(words $(CU_SRCS)) .cu file(s) for $(NVCC_ARCH),; CUDA backend not built (needs cuBLAS)),no nvcc at $(NVCC) (CUDA_HOME)))
$(info $(_)  cuBLAS    $(call found,$(call probe_ok,$(CUBLAS_PROBE))) $(if $(call probe_ok,$(CUBLAS_PROBE)),$(call probe_header,$(CUBLAS_PROBE)) ($(call probe_lib,$(CUBLAS_PROBE))),$(if $(HAVE_CUDA),no cublas_v2.h + -lcublas under $(CUDA_HOME),not probed without CUDA)))
$(info $(_)  NCCL      $(call found,$(call probe_ok,$(NCCL_PROBE))) $(if $(call probe_ok,$(NCCL_PROBE)),$(call probe_header,$(NCCL_PROBE)) ($(call probe_lib,$(NCCL_PROBE)))$(if $(BUILD_NCCL),; NCCL transport built),$(if $(HAVE_CUDA),no nccl.h + -lnccl in NCCL_HOME/CUDA_HOME/system,not probed without CUDA)))
endif
ifeq ($(MPI),0)
$(info $(_)  MPI       disabled (MPI=0))
else
$(info $(_)  MPI       $(call found,$(HAVE_MPI)) $(if $(HAVE_MPI),$(call probe_header,$(MPI_PROBE)) ($(call probe_lib,$(MPI_PROBE))) via $(MPICC); MPI transport built; mpirun: $(or $(MPIRUN),none (test_mpi will be skipped)),$(if $(MPICC),$(CC) cannot build an MPI program with the flags of $(MPICC),no mpicc in PATH or MPI_HOME/bin (scripts/deps.sh installs Open MPI))))
endif
$(info $(_)  library   $(if $(LIB_SRCS),$(LIB_A) $(LIB_SO) from $(words $(LIB_SRCS)) C file(s),NO SOURCES YET ($(addsuffix /*.c,$(LIB_DIRS)))))
$(info $(_)  examples  $(call names,$(EXAMPLES)))
$(info $(_)  bench     $(call names,$(BENCHES)))
$(info $(_)  tests     $(if $(HAVE_CMOCKA),$(call names,$(TESTS)),SKIPPED: cmocka not found (apt-get install libcmocka-dev)))
$(info $(_)  C++       $(call found,$(HAVE_CXX)) $(if $(HAVE_CXX),$(CXX) $(CXX_VERSION): the tensor-core kernels on the CPU emulator (test_mma_emu),no $(CXX): test_mma_emu will skip (apt-get install g++, or CXX=...)))
$(if $(filter-out 0,$(DEPS_STATUS)),$(info $(_)  note      scripts/deps.sh could not install everything; see its messages above))
$(info )
endif

# ---------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------
.PHONY: all lib examples bench tests test valgrind run install clean help
.DEFAULT_GOAL := all

all: lib examples bench $(if $(HAVE_CMOCKA),tests)
lib: $(LIB_A) $(LIB_SO)
examples: $(EXAMPLES)
bench: $(BENCHES)

ifeq ($(HAVE_CMOCKA),)
test tests valgrind:
	@echo "error: cmocka not found, cannot build the tests." >&2
	@echo "  install it:  apt-get install libcmocka-dev   (sudo apt-get install libcmocka-dev)" >&2
	@echo "  or point at an unpacked prefix:  make test CMOCKA_ROOT=/path/to/usr" >&2
	@exit 1
else
tests: $(TESTS)
# run_tests.sh runs every DIR/test_*: first drop binaries whose source is gone.
STALE_TESTS = $(filter-out $(TESTS),$(wildcard $(BUILD)/tests/test_*))
# Under ThreadSanitizer one OpenBLAS thread: OpenBLAS's own thread pool is
# not instrumented, so TSan cannot see its synchronisation and reports the
# writes of its threads as races with the caller's later reads (a large
# enough gemm in a one-rank program, where dt_launch leaves OpenBLAS its
# threads: bench/blocks --group's blocks, 2026-12-01).
TSAN_ENV = $(if $(findstring thread,$(SANITIZE)),OPENBLAS_NUM_THREADS=1)
test: $(TESTS) $(EXAMPLES) $(BENCHES) $(STAGE_PC)
	@mkdir -p $(BUILD)/tests
	$(if $(STALE_TESTS),rm -f $(STALE_TESTS))
	$(if $(EMU_ON),DT_TEST_TIMEOUT=$${DT_TEST_TIMEOUT:-1200} DT_EMU_DEVICES=$${DT_EMU_DEVICES:-4}) MPIRUN='$(MPIRUN)' \
	    $(TSAN_ENV) $(DOCS_ENV) bash tests/run_tests.sh $(BUILD)/tests

# valgrind memcheck over every test binary (the MPI suite excepted): no
# invalid access and no definite or indirect leak, else the test fails.
# Slow (about 13 minutes on a 2-core machine, 2026-11-29); DT_TEST_QUICK skips the
# 65,536-token run and runs a few long cases smaller.
# valgrind runs one thread at a time, unfairly, and OpenBLAS's kernels some
# hundred times slower than natively: a rank can wait for a peer far beyond
# the tests' 30 s bound (harness.c) without any hang, so the waits get the
# library's default bound instead.
# Use a CPU-only build (make CUDA=0 MPI=0 valgrind): the CUDA runtime's and
# Open MPI's dlopen paths trip valgrind false positives inside glibc.
VALGRIND_CMD = valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect
valgrind: $(TESTS) $(EXAMPLES) $(BENCHES) $(STAGE_PC)
	DT_TEST_QUICK=1 DT_TEST_TIMEOUT=3600 DT_TIMEOUT_MS=$${DT_TIMEOUT_MS:-600000} DT_TEST_WRAPPER='$(VALGRIND_CMD)' \
	    MPIRUN='$(MPIRUN)' $(DOCS_ENV) bash tests/run_tests.sh $(BUILD)/tests
endif

# make run: about a minute of training on the CPU (4 ranks as threads, tp 2 x
# cp 2, striped attention); ARGS=... replaces these flags.
RUN_ARGS := --ranks 4 --tp 2 --cp 2 --order striped --layers 4 --dim 128 --heads 4 --seq 128 \
    --batch 16 --steps 400 --warmup 20 --cosine --lr 3e-3 --log-every 25 --sample 160
run: $(EXAMPLES)
	$(BUILD)/examples/train_gpt $(or $(ARGS),$(RUN_ARGS))

# Written at parse time; this rule only covers it going missing mid-run.
$(STAMP): ;

# One pattern rule for all C objects; -MMD -MP writes build/obj/x.d beside x.o.
$(BUILD)/obj/%.o: %.c $(STAMP)
	@mkdir -p $(@D)
	$(CC) $(DT_CPPFLAGS) $(DT_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/tests/%.o: DT_CPPFLAGS += $(TEST_CPPFLAGS)

# CUDA=emu: the host C++ compiler, for the emulator (EMU_CXXFLAGS).
CU_COMPILE = $(if $(EMU_ON),$(CXX) -x c++ $(EMU_CXXFLAGS) -DDT_HAVE_CUDA,$(NVCC) $(CU_ARCH_FLAGS) $(NVCC_FLAGS) $(CU_SPILL_FLAGS))
CU_ARCH_FLAGS = -arch=$(NVCC_ARCH)
# The forward kernels and the wgmma backward keep everything in registers: a
# spill there is a build error (ptxas -warn-spills under -Werror
# all-warnings), so a change that brings one back shows at once (one came in
# unseen with commit 631b7f2: 220 bytes in the wgmma forward at D = 64).
# Not the mma backward (80 bytes at D = 128, docs/KERNELS.md), nor a
# debug build. SPILL_CHECK=0 turns the check off (another nvcc than the
# CUDA 13.0 the figures in the kernels' comments come from may allocate
# registers differently).
$(BUILD)/obj/attention/cuda/mma_fwd.cu.o $(BUILD)/obj/attention/cuda/wgmma_fwd.cu.o \
$(BUILD)/obj/attention/cuda/wgmma_bwd.cu.o: CU_SPILL_FLAGS = \
    $(if $(or $(DEBUG_ON),$(filter 0 no,$(SPILL_CHECK))),,-Xptxas -warn-spills)
# The Hopper attention kernels use wgmma, which exists only for the
# architecture-specific target sm_90a (its cubin runs on 9.0 devices: H100,
# H200). With NVCC_ARCH=sm_90 those files are built for sm_90a and their host
# side told so (DT_WGMMA_SM90A); for any other NVCC_ARCH they keep trapping
# stubs and reports the kernel unavailable. The -gencode form, not the
# -arch=sm_90a shorthand: newer nvcc also runs a plain sm_90 pass for the
# shorthand, and that pass rejects wgmma.
SM90A_GENCODE := -gencode=arch=compute_90a,code=sm_90a
$(BUILD)/obj/attention/cuda/wgmma_fwd.cu.o $(BUILD)/obj/attention/cuda/wgmma_bwd.cu.o: CU_ARCH_FLAGS = \
    $(if $(filter sm_90 sm_90a,$(NVCC_ARCH)),$(SM90A_GENCODE) -DDT_WGMMA_SM90A,-arch=$(NVCC_ARCH))
$(BUILD)/obj/%.cu.o: %.cu $(STAMP)
	@mkdir -p $(@D)
	$(CU_COMPILE) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(LIB_A): $(LIB_OBJS)
	$(if $(LIB_OBJS),,@echo "error: no library sources ($(addsuffix /*.c,$(LIB_DIRS)))" >&2; exit 1)
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $^

$(LIB_SO): $(LIB_OBJS)
	$(if $(LIB_OBJS),,@echo "error: no library sources ($(addsuffix /*.c,$(LIB_DIRS)))" >&2; exit 1)
	@mkdir -p $(@D)
	$(CC) -shared -Wl,-soname,libdtensor.so -o $@ $^ $(DT_LDFLAGS) $(DT_LDLIBS)

# Objects reached only through pattern rules count as intermediate and make
# would delete them after linking; keep them so rebuilds stay incremental.
.SECONDARY: $(EXAMPLE_OBJS) $(BENCH_OBJS) $(TEST_OBJS) $(TEST_HELPER_OBJS)

# Programs link the static library: they run from the tree with no rpath.
$(BUILD)/examples/%: $(BUILD)/obj/examples/%.o $(LIB_A)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(DT_LDFLAGS) $(DT_LDLIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIB_A)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(DT_LDFLAGS) $(DT_LDLIBS)

$(BUILD)/tests/test_%: $(BUILD)/obj/tests/test_%.o $(TEST_HELPER_OBJS) $(LIB_A)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(TEST_LDFLAGS) -lcmocka $(DT_LDFLAGS) $(DT_LDLIBS)

# The tensor-core kernels on the CPU emulator (tests/emu/emu.h): their .cu
# sources, unchanged, compiled by the host C++ compiler (whatever CUDA=
# says) with DT_CUDA_EMULATE, and DT_MMA_EMU_PREFIX so that they link beside
# the library's, into test_mma_emu. No C++ runtime is needed (as with nvcc's
# objects), so cc links it. Without a C++ compiler the test is built without
# them and skips its cases.
EMU_KERNEL_OBJS := $(patsubst %,$(BUILD)/obj/emu/attention/cuda/%.o,mma_fwd mma_bwd wgmma_fwd wgmma_bwd)
EMU_OBJS := $(BUILD)/obj/tests/emu/runtime.o $(BUILD)/obj/tests/emu/cudart.o \
    $(if $(HAVE_CXX),$(EMU_KERNEL_OBJS))
.SECONDARY: $(EMU_OBJS)
# Its x86-64 fiber switch keeps no CET shadow stack (runtime.c says why).
$(BUILD)/obj/tests/emu/runtime.o: DT_CFLAGS += $(if $(filter x86_64%,$(MULTIARCH)),-fcf-protection=none)

$(BUILD)/obj/emu/%.o: %.cu $(STAMP)
	@mkdir -p $(@D)
	$(CXX) -x c++ $(EMU_CXXFLAGS) -DDT_MMA_EMU_PREFIX -MMD -MP -MF $(@:.o=.d) -c $< -o $@

ifeq ($(HAVE_CXX),)
$(BUILD)/obj/tests/test_mma_emu.o: DT_CPPFLAGS += -DDT_EMU_NO_CXX='"$(CXX)"'
endif

$(BUILD)/tests/test_mma_emu: $(BUILD)/obj/tests/test_mma_emu.o $(EMU_OBJS) $(TEST_HELPER_OBJS) $(LIB_A)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(TEST_LDFLAGS) -lcmocka $(DT_LDFLAGS) $(DT_LDLIBS)

# The emulated CUDA runtime and cuBLAS alone (tests/emu/cudart.c).
$(BUILD)/tests/test_emu_cudart: $(BUILD)/obj/tests/test_emu_cudart.o $(BUILD)/obj/tests/emu/cudart.o \
    $(TEST_HELPER_OBJS) $(LIB_A)
	@mkdir -p $(@D)
	$(CC) -o $@ $^ $(TEST_LDFLAGS) -lcmocka $(DT_LDFLAGS) $(DT_LDLIBS)

# The emulated NCCL alone (tests/emu/nccl.c): only CUDA=emu builds it into
# the library; other builds compile the suite to report itself skipped.
ifeq ($(EMU_ON),)
$(BUILD)/obj/tests/test_emu_nccl.o: DT_CPPFLAGS += -DDT_EMU_NCCL_SKIP
endif

# Headers keep their subdirectory (public headers include each other as
# "../collectives/comm.h"): $(PREFIX)/include/dtensor/{dtensor,collectives,attention}/.
# Each installed header is then compiled alone, as a user would include it.
# What a static link needs besides libdtensor.a: the libraries this build
# found (OpenBLAS, and CUDA, NCCL, MPI when built in) with their -L / rpath.
# dtensor.pc's Libs.private and dtensor::dtensor_static's link interface.
PC_LIBS_PRIVATE = $(filter -L% -Wl%,$(DT_LDFLAGS)) $(DT_LDLIBS)
# The CMake package: lib/cmake/dtensor/ holds these, generated like dtensor.pc.
CMAKE_TEMPLATES := cmake/dtensorConfig.cmake.in cmake/dtensorConfigVersion.cmake.in
# $(call install_into,ROOT,PREFIX): the files under ROOT, dtensor.pc naming
# PREFIX (the CMake files find their prefix from where they lie).
define install_into
	install -d $(1)/lib/pkgconfig $(1)/lib/cmake/dtensor
	install -m 644 $(LIB_A) $(1)/lib/
	install -m 755 $(LIB_SO) $(1)/lib/
	@for h in $(PUBLIC_HEADERS); do \
	    echo "install -D -m 644 $$h $(1)/include/dtensor/$$h"; \
	    install -D -m 644 $$h $(1)/include/dtensor/$$h || exit 1; \
	done
	sed -e 's|@PREFIX@|$(2)|g' -e 's|@VERSION@|$(VERSION)|g' \
	    -e 's|@LIBS_PRIVATE@|$(PC_LIBS_PRIVATE)|g' dtensor.pc.in >$(1)/lib/pkgconfig/dtensor.pc
	@for t in $(CMAKE_TEMPLATES); do \
	    f=$(1)/lib/cmake/dtensor/$$(basename $$t .in); echo "generate $$f from $$t"; \
	    sed -e 's|@VERSION@|$(VERSION)|g' -e 's|@LIBS_PRIVATE@|$(PC_LIBS_PRIVATE)|g' $$t >$$f || exit 1; \
	done
	@for h in $(PUBLIC_HEADERS); do \
	    printf '$(H)include "%s"\nint dt_header_check;\n' $$h | \
	    $(CC) -std=c11 -Wall -Wextra -Werror -fsyntax-only -I$(1)/include/dtensor -x c - || \
	    { echo "error: installed header $$h does not compile on its own" >&2; exit 1; }; \
	done
	@echo "installed $(words $(PUBLIC_HEADERS)) headers, libdtensor.{a,so}, dtensor.pc, dtensorConfig.cmake under $(1)"
endef
# Then, installing for real (DESTDIR empty) as root, ldconfig, so that the
# loader finds libdtensor.so at once under a prefix it searches (/usr/local
# on Debian); under any other prefix it says how programs will find it.
install: $(LIB_A) $(LIB_SO)
	$(call install_into,$(DESTDIR)$(PREFIX),$(PREFIX))
	@if [ -n "$(DESTDIR)" ]; then exit 0; fi; \
	libdir='$(PREFIX)/lib'; \
	if [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null 2>&1; then \
	    echo ldconfig; ldconfig || exit 1; \
	    ldconfig -p | grep -q "=> $$libdir/libdtensor.so$$" && exit 0; \
	    echo "note: $$libdir is not among the loader's directories (/etc/ld.so.conf):"; \
	else \
	    echo "note: ldconfig not run (needs root); programs may not find $$libdir/libdtensor.so:"; \
	fi; \
	echo "  link with -Wl,-rpath,$$libdir (README.md shows the line), or set LD_LIBRARY_PATH=$$libdir"

# What `make install` gives a user, under $(BUILD)/stage for tests/test_docs.c
# (README.md's program built against it with pkg-config and with CMake);
# make test makes it.
$(STAGE_PC): $(LIB_A) $(LIB_SO) $(ALL_HEADERS) dtensor.pc.in $(CMAKE_TEMPLATES)
	@rm -rf $(STAGE)
	$(call install_into,$(STAGE),$(STAGE))
# The environment test_docs reads: the stage, and how to compile against it.
DOCS_ENV = DT_DOCS_STAGE='$(STAGE)' DT_DOCS_CC='$(CC)' DT_DOCS_CFLAGS='$(SAN_FLAGS)'

clean:
	rm -rf build build-*

help:
	@echo "targets:"
	@echo "  all (default)  library, examples, bench, and tests when cmocka is found"
	@echo "  lib examples bench tests   build just that part"
	@echo "  test           build and run the cmocka suites (DT_TEST_TIMEOUT=s per binary, DT_TIMEOUT_MS passed on)"
	@echo "  valgrind       the test suites under valgrind memcheck (slow)"
	@echo "  run            build, then train a small model: build/examples/train_gpt (ARGS=... replaces its flags)"
	@echo "  install        public headers, libdtensor.{a,so}, dtensor.pc, lib/cmake/dtensor/ into DESTDIR/PREFIX;"
	@echo "                 then ldconfig when root and DESTDIR is empty"
	@echo "  clean          remove build/ and build-*/"
	@echo "variables (current value):"
	@echo "  CC=$(CC)  CFLAGS/CPPFLAGS/LDFLAGS/LDLIBS (appended to ours)"
	@echo "  CUDA=$(CUDA) (auto|0|1|emu)  CUDA_HOME=$(CUDA_HOME)  NCCL_HOME=$(NCCL_HOME)  NVCC_ARCH=$(NVCC_ARCH)"
	@echo "  MPI=$(MPI) (auto|0|1)  MPI_HOME=$(MPI_HOME)"
	@echo "  CMOCKA_ROOT=$(CMOCKA_ROOT)  OPENBLAS_ROOT=$(OPENBLAS_ROOT)  (prefix with include/ and lib/[<multiarch>/])"
	@echo "  SANITIZE=$(SANITIZE) (e.g. address,undefined or 1; builds in build-san/; thread in build-tsan/)"
	@echo "  DEBUG=$(DEBUG) (1: -O0 -g3 -DDT_DEBUG; builds in build-debug/)"
	@echo "  LINEINFO=$(LINEINFO) (1: nvcc -lineinfo, source lines for profilers)"
	@echo "  WGMMA_NARROW=$(WGMMA_NARROW) (0: the wgmma forward without its narrow tiles, to measure it so)"
	@echo "  SPILL_CHECK=$(SPILL_CHECK) (0: a register spill in the attention forward kernels or the wgmma backward is no build error)"
	@echo "  DEPS=$(DEPS) (auto: scripts/deps.sh installs missing cmocka/OpenBLAS/CMake/Open MPI; 0: probe only)"
	@echo "  PREFIX=$(PREFIX)  DESTDIR=$(DESTDIR)"

-include $(LIB_OBJS:.o=.d) $(EXAMPLE_OBJS:.o=.d) $(BENCH_OBJS:.o=.d) \
    $(TEST_OBJS:.o=.d) $(TEST_HELPER_OBJS:.o=.d) $(EMU_OBJS:.o=.d)
