# The two entry points of a fresh Debian 12 machine: `make run` and `make test`.
BUILD ?= build
JOBS ?= $(shell nproc)
K3 := $(BUILD)/apps/k3

.PHONY: all deps configure build run test clean format

all: build

deps:
	@scripts/setup-deps.sh $(BUILD)

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release --log-level=WARNING

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Generates text on the built-in demo model (synthesised into the cache directory on first
# use). Builds only the k3 binary, not the tests.
run: configure
	@cmake --build $(BUILD) -j $(JOBS) --target k3
	$(K3) generate --prompt "The capital of France is" --n-predict 32

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

format:
	@git ls-files '*.h' '*.cc' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
