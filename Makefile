# flashdecode — the two commands the README gives:
#   make run    build, then generate a story with the bundled model
#   make test   build, then run every test (GPU tests skip without a GPU)
# and two for CI:
#   make asan   the CPU suite built with AddressSanitizer + UBSan, in build-asan
#   make fuzz   the libFuzzer target over the public API, FUZZ_TIME seconds
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all build configure run test deps cuda-tools install clean asan fuzz fuzz-deps

all: build

# Debian packages the build needs; installed only when missing.
DEB_PACKAGES := cmake pkg-config libcmocka-dev
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/flashdecode generate

test: build cuda-tools
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# cuobjdump for test_fatbin and test_code_size (tests/check_fatbin.sh,
# check_code_size.sh), and nvdisasm, which cuobjdump runs to print SASS for
# test_code_size, when nvcc is here without them: NVIDIA's PyPI wheels
# nvidia-cuda-cuobjdump (0.3 MB) and nvidia-cuda-nvdisasm (5 MB) for nvcc's CUDA
# major version, into $(BUILD)/tools. Never fails: without them the tests skip.
cuda-tools: configure
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
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)

# ---- Sanitizers ---------------------------------------------------------------
# The whole CPU suite (GPU tests excluded) under ASan + UBSan, CUDA off.
# OMP_WAIT_POLICY=passive: idle OpenMP workers sleep instead of spinning,
# which keeps thousands of short calls fast on a loaded machine.
ASAN_BUILD ?= build-asan
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 OMP_WAIT_POLICY=passive
asan: | deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFD_SANITIZE=ON -DFD_CUDA=OFF \
	  -DFD_BUILD_CLI=OFF $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && $(ASAN_ENV) ctest --output-on-failure -j $(JOBS) -LE gpu

# libFuzzer (clang) over the public API's argument checks and the CPU backend,
# with ASan + UBSan, for FUZZ_TIME seconds, starting from the committed seed
# corpus tests/fuzz/corpus (new inputs go to $(FUZZ_BUILD)/corpus, a crashing
# one to $(FUZZ_BUILD)/artifacts/; replay it with
# $(FUZZ_BUILD)/tests/fuzz/fuzz_api <file>, or fuzz_replay in any build).
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
fuzz: | deps fuzz-deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFD_CUDA=OFF \
	  -DFD_FUZZ=ON -DFD_BUILD_CLI=OFF
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_api
	mkdir -p $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/artifacts
	OMP_WAIT_POLICY=passive $(FUZZ_BUILD)/tests/fuzz/fuzz_api -max_total_time=$(FUZZ_TIME) -timeout=30 \
	  -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/artifacts/ \
	  $(FUZZ_BUILD)/corpus tests/fuzz/corpus
