# flashdecode — the two commands the README gives:
#   make run     build the library and the CLI, then generate a story with the bundled model
#   make test    build everything, then run the C tests (GPU tests skip without a GPU)
# and, for CI and developers:
#   make cuda-check  the CUDA backend built in build-cuda (needs nvcc, no GPU), its tests
#                    (GPU tests skip without a GPU), and the binary's GPU targets and code
#                    size (fetches cuobjdump/nvdisasm from PyPI once, when nvcc lacks them)
#   make asan        the CPU suite built with AddressSanitizer + UBSan, in build-asan
#   make fuzz        the libFuzzer target over the public API, FUZZ_TIME seconds (clang)
#   make deps / fuzz-deps   optional: Debian packages (cmake, pkg-config, cmocka; clang)
#
# CUDA: built when a GPU is present (`nvidia-smi -L` succeeds) and CMake finds nvcc, or when
# asked: `make run CUDA=1` (-DFD_CUDA=ON); `CUDA=0` forces it off (-DFD_CUDA=OFF).
# Other CMake flags: CMAKE_FLAGS="-DFD_CUDA_ARCHS=90a-real ..." (applied at every configure).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CUDA ?=

ifeq ($(CUDA),1)
  FD_CUDA := ON
else ifeq ($(CUDA),0)
  FD_CUDA := OFF
else ifeq ($(CUDA),)
  # a GPU: AUTO (CMake builds CUDA when it finds nvcc); none: CPU only
  FD_CUDA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo AUTO || echo OFF)
else
  $(error CUDA=$(CUDA): use CUDA=1 (build the CUDA backend) or CUDA=0 (CPU only))
endif

.PHONY: all build configure run test cuda-check cuda-tools deps install clean asan fuzz fuzz-deps

all: build

# Configure every time (quick when nothing changed), so CUDA=... and CMAKE_FLAGS
# take effect in an existing build folder.
configure:
	@echo "flashdecode: CUDA backend $(FD_CUDA) (CUDA=1 / CUDA=0 to choose)"
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=$(FD_CUDA) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The demo needs the CLI only (it links the static library): no tests built.
run: configure
	cmake --build $(BUILD) -j $(JOBS) --target flashdecode_cli flashdecode
	./$(BUILD)/flashdecode generate

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE cuda-tools

# ---- The CUDA build without a GPU (CI) -----------------------------------------
CUDA_BUILD ?= build-cuda
cuda-check:
	cmake -S . -B $(CUDA_BUILD) -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON $(CMAKE_FLAGS)
	cmake --build $(CUDA_BUILD) -j $(JOBS)
	$(MAKE) --no-print-directory cuda-tools BUILD=$(CUDA_BUILD)
	cd $(CUDA_BUILD) && ctest --output-on-failure -j $(JOBS)

# cuobjdump for test_fatbin and test_code_size (tests/check_fatbin.sh,
# check_code_size.sh), and nvdisasm, which cuobjdump runs to print SASS for
# test_code_size, when nvcc is here without them: NVIDIA's PyPI wheels
# nvidia-cuda-cuobjdump (0.3 MB) and nvidia-cuda-nvdisasm (5 MB) for nvcc's CUDA
# major version, into $(BUILD)/tools. Never fails: without them the tests skip.
cuda-tools:
	@if command -v nvcc >/dev/null 2>&1; then \
	  major=$$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p'); \
	  for t in cuobjdump nvdisasm; do \
	    if ! command -v $$t >/dev/null 2>&1 && [ ! -x "$$(dirname "$$(command -v nvcc)")/$$t" ] && \
	      ! ls $(BUILD)/tools/$$t/nvidia/*/bin/$$t >/dev/null 2>&1; then \
	      echo "installing $$t (PyPI nvidia-cuda-$$t, CUDA $$major) into $(BUILD)/tools"; \
	      python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps \
	        --target $(BUILD)/tools/$$t "nvidia-cuda-$$t>=$$major,<$$((major + 1))" || \
	        echo "(no $$t: the tests that need it skip)"; \
	    fi; \
	  done; \
	fi

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(CUDA_BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)

# Optional Debian packages: cmake and pkg-config, and the system's cmocka (without
# it the tests build the vendored copy in third_party/cmocka). Nothing requires this.
DEB_PACKAGES := cmake pkg-config libcmocka-dev
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

# ---- Sanitizers ---------------------------------------------------------------
# The whole CPU suite (GPU tests excluded) under ASan + UBSan, CUDA off.
# OMP_WAIT_POLICY=passive: idle OpenMP workers sleep instead of spinning,
# which keeps thousands of short calls fast on a loaded machine.
ASAN_BUILD ?= build-asan
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 OMP_WAIT_POLICY=passive
asan:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFD_SANITIZE=ON -DFD_CUDA=OFF \
	  -DFD_BUILD_CLI=OFF $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && $(ASAN_ENV) ctest --output-on-failure -j $(JOBS) -LE gpu

# libFuzzer (clang) over the public API's argument checks and the CPU backend,
# with ASan + UBSan, for FUZZ_TIME seconds, starting from the committed seed
# corpus tests/fuzz/corpus (new inputs go to $(FUZZ_BUILD)/corpus, a crashing
# one to $(FUZZ_BUILD)/artifacts/; replay it with
# $(FUZZ_BUILD)/tests/fuzz/fuzz_api <file>, or fuzz_replay in any build).
# Needs clang with its libFuzzer runtime and OpenMP (`make fuzz-deps` installs them).
FUZZ_BUILD ?= build-fuzz
FUZZ_TIME ?= 60
FUZZ_DEB_PACKAGES := clang libclang-rt-14-dev libomp-dev
fuzz-deps:
	@missing=""; command -v clang >/dev/null 2>&1 || missing="$(FUZZ_DEB_PACKAGES)"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
fuzz:
	@command -v clang >/dev/null 2>&1 || { echo "make fuzz needs clang: make fuzz-deps installs it"; exit 1; }
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFD_CUDA=OFF \
	  -DFD_FUZZ=ON -DFD_BUILD_CLI=OFF
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_api
	mkdir -p $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/artifacts
	OMP_WAIT_POLICY=passive $(FUZZ_BUILD)/tests/fuzz/fuzz_api -max_total_time=$(FUZZ_TIME) -timeout=30 \
	  -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/artifacts/ \
	  $(FUZZ_BUILD)/corpus tests/fuzz/corpus
