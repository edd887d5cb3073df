# Quick start: `make demo` and `make test` on a fresh machine.
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
BUILD  := build/py
STAMP  := $(VENV)/.torchtpu-setup
JOBS   ?= $(shell nproc)
export TORCHTPU_JOBS := $(JOBS)
export TORCHTPU_BUILD_TESTS := ON

.PHONY: setup build layers test test-cpp test-py demo demo-pack bench conformance device-tests ecosystem wheel-check lint format clean

setup: $(STAMP)

# System tools (ninja, ccache, GoogleTest) from Debian when missing, then the
# venv with the pinned torch CPU wheel and the XLA:CPU PJRT plugin.
$(STAMP): pyproject.toml setup.py CMakeLists.txt
	@if ! command -v ninja >/dev/null || ! command -v ccache >/dev/null || ! dpkg -s libgtest-dev >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq ninja-build ccache libgtest-dev cmake >/dev/null; \
	  else echo "need ninja-build ccache libgtest-dev cmake (apt-get install)"; fi; fi
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0 xla-cpu-pjrt==0.0.1 pybind11 numpy pytest ninja ruff expecttest clang-format==17.0.6
	$(VPY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $(STAMP)

# Optional extras the tests exercise (pinned in pyproject.toml), kept out of
# `setup` so `make demo` never needs them. hf is resolved by pip with torch pinned on the
# same line, so its pure-Python dependencies install and torch is never replaced.
EXTRAS := $(VENV)/.torchtpu-extras
extra = $$($(VPY) -c "import tomllib; d = tomllib.load(open('pyproject.toml', 'rb')); print(' '.join(d['project']['optional-dependencies']['$(1)']))")
$(EXTRAS): pyproject.toml $(STAMP)
	$(VPY) -m pip install -q $(call extra,jax)
	$(VPY) -m pip install -q --no-deps $(call extra,titan)
	$(VPY) -m pip install -q torch==2.13.0 $(call extra,hf)
	touch $(EXTRAS)

# The torchax peer row of bench/run.py's GPT step table (the `peer` extra), kept out of
# `setup` and `demo`; --no-deps so torch is never replaced.
PEER := $(VENV)/.torchtpu-peer
$(PEER): pyproject.toml $(STAMP)
	$(VPY) -m pip install -q --no-deps $(call extra,peer)
	touch $(PEER)

build: setup
	cmake --build $(BUILD) -j $(JOBS)

test-cpp: build
	$(BUILD)/torchtpu_cpp_tests --gtest_brief=1

# The Python tests run in TEST_JOBS worker processes (pytest-xdist), each test file whole
# in one worker (its tests share module state and order); at most 4 by default, since
# the distributed tests start up to 4 ranks of their own. The 25 slowest tests are listed
# at the end (make test stays under 30 minutes on the 2-core machine).
TEST_JOBS ?= $(shell n=$$(nproc); echo $$(( n > 4 ? 4 : n )))
TESTDEPS := $(VENV)/.torchtpu-testdeps
$(TESTDEPS): Makefile $(STAMP)
	$(VPY) -m pip install -q pytest-xdist==3.8.0
	touch $(TESTDEPS)

test-py: build $(EXTRAS) $(TESTDEPS)
	$(VPY) -m pytest -q -n $(TEST_JOBS) --dist loadfile --durations=25 tests/python

# The include layering (tools/check_layers.py): also part of `make lint`.
layers:
	$(PYTHON) tools/check_layers.py

test: layers test-cpp test-py

demo: build
	$(VPY) examples/train_gpt.py

# The demo from a kernel pack: one run packs the programs it used into $(DEMO_PACK),
# then a cold process with an empty cache directory runs it from the pack (compiles=0).
DEMO_PACK ?= build/demo.pack
demo-pack: build
	$(VPY) -m torchtpu.cache pack $(DEMO_PACK) --run examples/train_gpt.py
	d=$$(mktemp -d) && TORCHTPU_CACHE_DIR=$$d TORCHTPU_CACHE_PACKS=$(DEMO_PACK) \
	  $(VPY) -m torchtpu.cache run examples/train_gpt.py; rc=$$?; rm -rf $$d; exit $$rc

bench: build $(PEER)
	$(VPY) bench/run.py
	$(VPY) bench/ops.py
	$(VPY) bench/dist.py
	$(VPY) bench/dist_threads.py
	$(VPY) bench/shapes.py

# PyTorch's OpInfo database on tpu vs CPU; regenerates docs/OP_COVERAGE.md (< 30 min).
conformance: build
	$(VPY) tests/conformance/run.py

# PyTorch's device-generic test machinery (instantiate_device_type_tests over op_db and
# module_db) on tpu vs CPU; a report, not a gate: regenerates docs/DEVICE_TESTS.md.
device-tests: build
	$(VPY) tests/device/run.py

# TorchTitan's llama3 debug model trained by its own trainer on tpu vs CPU (1 process and
# FSDP2 over 2 ranks); a report: regenerates docs/ECOSYSTEM.md (a few minutes).
ecosystem: build $(EXTRAS)
	PYTHONPATH=tests/ecosystem $(VPY) tests/ecosystem/run.py
	PYTHONPATH=python $(VPY) tests/ecosystem/hf_model_tests.py

# `pip install .` into a new venv (build/wheel-venv), then a first program from outside the
# tree; a report like `ecosystem` (~15 min on 2 cores: the wheel builds from scratch with
# JOBS compile jobs).
wheel-check:
	PYTHON=$(PYTHON) tests/ecosystem/wheel_check.sh

lint:
	$(VENV)/bin/ruff check python tests bench examples tools
	$(VENV)/bin/clang-format --dry-run -Werror csrc/*/*.cpp csrc/*/*.h tests/cpp/*.cpp tests/cpp/*.h
	$(PYTHON) tools/check_layers.py

format:
	$(VENV)/bin/ruff format python tests bench examples
	$(VENV)/bin/clang-format -i csrc/*/*.cpp csrc/*/*.h tests/cpp/*.cpp tests/cpp/*.h

clean:
	rm -rf build python/torchtpu/_C*.so
