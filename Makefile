# The two entry points of a fresh Debian 12 machine: `make run` and `make test`.
BUILD ?= build
JOBS ?= $(shell nproc)
K3 := $(BUILD)/apps/k3

# The sanitizer and fuzz builds live beside the normal one (docs/RELIABILITY.md). -O1 keeps
# them quick to compile and still fast enough to run; assertions stay on.
TSAN_BUILD ?= $(BUILD)-tsan
FUZZ_BUILD ?= $(BUILD)-fuzz
# The test programs' own code at -O0 there (K3_TEST_OPTIMIZE, tests/CMakeLists.txt): under the
# sanitizers it compiled in 2.6x the time at -O1, and the code under test stays at -O1.
SAN_CMAKE := -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1" -DK3_TEST_OPTIMIZE=-O0 \
             --log-level=WARNING
# One clang build serves both the ASan+UBSan suite and the fuzzers: K3_FUZZ instruments every
# library with ASan+UBSan (plus coverage), so the tests built there are the sanitizer build and
# CI compiles the project three times (normal, this, TSan), not four.
# Under ASan: the PyTorch reference suites (reference.*) run Python, not k3, and take a minute
# that ASan cannot improve; the page in chromium (browser.page) tests the page's JavaScript
# against the server, and its 5,000-token prompt under ASan's k3 took 327 s alone at the end of
# the stage (25 s in the normal build), while the server code it reaches runs under ASan in the
# serve suites (ServePage*, ServeEvents*, ServeTest*); everything else runs.
ASAN_EXCLUDE ?= ^(reference|browser)\.
# Under ASan (and any sanitizer) the 216-configuration determinism grid runs a pairwise
# covering subset of its settings (tests/pipeline/engine_test.cc); the normal suite runs it all.
# Under TSan: the suites with threads of their own (the read engine, the expert cache, the
# streaming engine, the server's GenerationService). The 216-configuration determinism grid
# and the batch scheduler's grids and its resume and cancel checks (single-threaded scheduler
# logic over many runs alone: minutes under TSan) run in the normal and ASan suites; under TSan
# the other engine and batch tests (faults, lookahead, prefill, packs, a batch's one trunk pass,
# interrupts) cover the same threads.
TSAN_TESTS ?= io_tests pipeline_tests server_tests
# The CacheSim* tests run the k3 binary (a single-threaded simulator): the TSan build compiles the
# libraries and these test programs only, not the commands (K3_TESTS_BUILD_K3=OFF). A 2,048-token
# prompt (SplitPrefillChunkTest.ALongPrompt*) runs so long under TSan that the earlier side of
# a TBB worker's read of the caller's stack (ordered by TBB's join, which TSan does not see) is
# gone from its history ("failed to restore the stack", also at history_size=4) and matches no
# suppression in tests/tsan.supp; the normal and ASan builds run it.
TSAN_FILTER ?= -EngineTest.DeterminismGrid*:BatchTest.EverySequence*:BatchTest.AResumed*:BatchTest.ACancelled*:*CacheSim*:SplitPrefillChunkTest.ALongPrompt*
# Under the sanitizers each GoogleTest program runs as this many shards (scripts/gtest-shards.sh),
# JOBS processes at once: a TSan process slows as it runs on (the pipeline suite took 434 s in
# one process, 80 s in two), and more shards than cores keep both cores busy to the end.
SAN_SHARDS ?= 4
# The programs with the longest shards under ASan (ServeTest's eight clients, the engine and
# batch suites), started first so that the two cores finish together.
SAN_FIRST ?= serve_tests pipeline_tests
FUZZ_CI_SECONDS ?= 10
FUZZ_SECONDS ?= 60
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS ?= halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp

# Ninja (Debian's ninja-build, in the run set of scripts/setup-deps.sh) compiles a target's files
# as soon as their own inputs exist, where the Makefiles' generator finishes one library before
# starting the next and leaves a core idle at each step (docs/TESTING.md). Evaluated when a recipe
# runs, after deps-run has installed it.
GENERATOR ?= $(if $(shell command -v ninja),Ninja,Unix Makefiles)
# Configures build dir $(1) with GENERATOR and the arguments $(2). CMake refuses to switch the
# generator of a configured dir: a cache written by another one is dropped first (the objects
# are rebuilt; the npm packages in $(1)/oracle stay).
cmake_configure = g=$$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' $(1)/CMakeCache.txt 2>/dev/null); \
  if [ -n "$$g" ] && [ "$$g" != "$(GENERATOR)" ]; then \
    echo "$(1): configured for $$g before; configuring for $(GENERATOR)"; \
    rm -rf $(1)/CMakeCache.txt $(1)/CMakeFiles; fi; \
  cmake -G "$(GENERATOR)" -S . -B $(1) $(2)

# The GoogleTest binaries of a configured build dir (every executable target named *_test or
# *_tests), so that new test folders are picked up without touching this file. `--target help`
# lists them as "... NAME" (Makefiles) or "NAME: phony" (Ninja).
test_targets = $$(cmake --build $(1) --target help | \
  sed -n 's/^\(\.\.\. \)\{0,1\}\([A-Za-z0-9_]*_tests\{0,1\}\)\(: phony\)\{0,1\}$$/\2/p' | sort -u)
# The paths of the binaries of test targets $(1), run inside their build dir; fails naming a
# missing one (use as `bins=$(call test_binaries,...) && ...`).
test_binaries = $$(for t in $(1); do b=$$(find tests -name $$t -type f -perm -u+x | head -1); \
  [ -n "$$b" ] || { echo "no test binary $$t" >&2; exit 1; }; echo ./$$b; done)

# Targets $(1), then those of $(2) not in $(1).
first_then = $(1) $$(for t in $(2); do case " $(1) " in *" $$t "*) ;; *) echo $$t;; esac; done)

.PHONY: all deps deps-run configure check-fixtures build run test test-normal test-asan \
        test-tsan fuzz fuzz-ci fuzz-build clean format

all: build

# What the k3 binary needs to build and run (`make run`), and everything `make test` uses.
deps-run:
	@scripts/setup-deps.sh run $(BUILD)

deps:
	@scripts/setup-deps.sh test $(BUILD)

configure: deps-run
	@$(call cmake_configure,$(BUILD),-DCMAKE_BUILD_TYPE=Release --log-level=WARNING)

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Generates text on the built-in demo model (synthesised into the cache directory on first
# use). Builds only the k3 binary, not the tests.
run: configure
	@cmake --build $(BUILD) -j $(JOBS) --target k3
	$(K3) generate --prompt "The capital of France is" --n-predict 32

# Everything CI runs: the normal suite, then ASan+UBSan, TSan and a short fuzzing run.
test: test-normal
	@$(MAKE) --no-print-directory test-asan
	@$(MAKE) --no-print-directory test-tsan
	@$(MAKE) --no-print-directory fuzz-ci

# The tests compare with the shared fixtures (CMakeLists.txt says where it looks): without them,
# stop before building, saying where they were expected, instead of failing dozens of tests.
check-fixtures: configure
	@shared=$$(sed -n 's/^K3_SHARED_DIR:PATH=//p' $(BUILD)/CMakeCache.txt); \
	  [ -d "$$shared/fixtures" ] || { echo "make test: no shared fixtures at $$shared" \
	  "(put the repository beside shared/, or set K3_SHARED_DIR)" >&2; exit 2; }

test-normal: deps check-fixtures build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The whole suite under ASan+UBSan (the k3 binary the end-to-end tests run included), in the
# fuzz build: the GoogleTest programs whole, SAN_SHARDS shards each, JOBS processes at once
# (scripts/gtest-shards.sh; the normal build runs every test in a process of its own), then the
# rest of ctest (the fuzzers' corpus replays, the sshfs volume test).
test-asan: deps
	@$(call cmake_configure,$(FUZZ_BUILD),-DK3_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ $(SAN_CMAKE))
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target k3 fuzzers $(call test_targets,$(FUZZ_BUILD))
	@[ -e $(FUZZ_BUILD)/oracle ] || ln -s $(abspath $(BUILD))/oracle $(FUZZ_BUILD)/oracle
	@cd $(FUZZ_BUILD) && bins=$(call test_binaries,$(call first_then,$(SAN_FIRST),$(call test_targets,.))) && \
	  $(CURDIR)/scripts/gtest-shards.sh $(JOBS) $(SAN_SHARDS) $$bins -- --gtest_brief=1
	@cd $(FUZZ_BUILD) && ctest --output-on-failure -j $(JOBS) -LE gtest -E '$(ASAN_EXCLUDE)'
# The threaded suites under TSan, the same way, with TSAN_FILTER.
test-tsan: deps
	@$(call cmake_configure,$(TSAN_BUILD),-DK3_SANITIZE=thread -DK3_TESTS_BUILD_K3=OFF $(SAN_CMAKE))
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TESTS)
	@cd $(TSAN_BUILD) && bins=$(call test_binaries,$(TSAN_TESTS)) && \
	  $(CURDIR)/scripts/gtest-shards.sh $(JOBS) $(SAN_SHARDS) $$bins -- --gtest_brief=1 \
	  --gtest_filter='$(TSAN_FILTER)'

# libFuzzer targets (fuzz/), with clang: each runs FUZZ_SECONDS from the committed seeds, JOBS
# targets at once, after ctest replays every committed corpus file (the regression inputs of
# past crashes).
fuzz-build: deps
	@$(call cmake_configure,$(FUZZ_BUILD),-DK3_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ $(SAN_CMAKE))
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers

fuzz: fuzz-build
	@cd $(FUZZ_BUILD) && ctest --output-on-failure -j $(JOBS) -L fuzz
	@fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_BUILD) $(JOBS)

# In CI after test-asan, which has built the fuzzers (fuzz-build is then a quick check) and
# replayed every corpus file in its ctest run: only the fuzzing here.
fuzz-ci: fuzz-build
	@fuzz/run.sh $(FUZZ_CI_SECONDS) $(FUZZ_BUILD) $(JOBS)

format:
	@git ls-files '*.h' '*.cc' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
