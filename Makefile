# thermite: `make` builds, `sudo make run` serves on the defaults, `sudo make agents test` is what CI runs.
SHELL    := /bin/bash
GO       ?= go
BIN      := bin/thermite
# thermite-run-as: `thermite run-as` in a binary that links only the
# broker's protocol, for an operator's quick start.
RUNAS_BIN := bin/thermite-run-as
GOFLAGS_BUILD := -trimpath
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
TEST_PARALLEL ?= 4

.PHONY: all build run test vet staticcheck unit bench soak gpu install clean vm-i386 vm-kernels agents

all: build

build:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $(BIN) ./cmd/thermite
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $(RUNAS_BIN) ./cmd/thermite-run-as

# The main job: the role users, then the broker in the foreground on the
# embedded defaults (state in /var/lib/thermite, bbolt ledger under it); the
# broker runs the isolation self-test before it starts the controller.
run: build
	./$(BIN) roles ensure
	./$(BIN) serve

# The agent programs the rig runs in lanes (Pi, Claude Code, Codex,
# OpenCode), at agents/package.json's pinned versions, into
# /opt/thermite/agents (THERMITE_AGENTS): the agent end-to-end tests run
# them from there and skip, saying so, where they are missing.
agents:
	./scripts/agents.sh

vet:
	$(GO) mod tidy -diff
	test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { gofmt -l .; exit 1; }
	$(GO) vet ./...

staticcheck:
	$(GO) run $(STATICCHECK) ./...

# Every test, as root: isolation tests create throwaway role users and run
# probes as them; tests that need what this machine lacks skip and say why.
# Tests with rigs of their own run TEST_PARALLEL at a time (testrig.Parallel):
# most of a rig test's time is its processes' starts and waits, not CPU.
# testtimes prints go test's usual lines, then each package's time and the
# slowest tests, so CI's log shows where its minutes go.
test: build vet staticcheck
	set -o pipefail; $(GO) test -json -count=1 -parallel $(TEST_PARALLEL) -timeout 35m ./... | $(GO) run ./scripts/testtimes

# The fast tests: no root, no podman, no virtual machine (root-only tests
# skip under -short, saying so).
unit:
	$(GO) test -short -count=1 ./...

# Boots Debian's 6.12 kernel under qemu (software emulation) twice, with
# ia32_emulation off and on, and checks the seccomp tests in it: about a
# minute on two cores once the kernel is in /var/cache/thermite-vm.
# Inside the machine only the filter's architecture tests run (the whole
# seccomp suite took two minutes a boot under emulation):
# THERMITE_VM_RUN= make vm-i386 runs every test of the package there.
THERMITE_VM_RUN ?= ^(TestI386ABIKilled|TestX32Killed)$$
vm-i386:
	THERMITE_VM=1 THERMITE_VM_RUN='$(THERMITE_VM_RUN)' $(GO) test -count=1 -v -run '^TestI386BothWays$$' ./e2e/vm

# The rig on Debian's 6.12 (cgroup v2 writable and read-only) and 6.1
# (Landlock ABI 2) under qemu, each with a debootstrap root as its
# initramfs: the start, the self-test, the bombs, a stop and a trial.
# The kernels and the root are kept in /var/cache/thermite-vm.
# THERMITE_VM_STOPBENCH=1 adds 6.12's stop figures (cgroup.kill against
# the helper alone), which take minutes under emulation.
vm-kernels:
	THERMITE_VM=1 $(GO) test -count=1 -v -timeout 40m -run '^TestRigOnKernelsAndCgroupSetups$$' ./e2e/vm

bench: build
	./scripts/bench.sh

# A rig as it runs all day: 16 lanes starting and ending trials with
# commands and API calls for SOAK_TIME (default 2m); prints each quarter
# and how the last compares with the first. Then the flood soak: 15 lanes
# flooding every path for SOAK_TIME (default 3m) while lane 16 leaves
# marks and the judge times a build every JUDGE_EVERY (default 20s); it
# prints the judge's timing idle and flooded and checks nothing was lost.
soak: build
	$(GO) test -run '^$$' -bench '^Benchmark(Flood)?Soak$$' -benchtime 1x -timeout 90m ./e2e/rig/

# The GPU build: cgo and go-nvml (which loads the driver's library at run
# time), linked dynamically against glibc only. landlocktsync keeps
# go-landlock from linking libcap's psx into a cgo build.
GPU_BIN ?= bin/thermite-gpu
gpu:
	CGO_ENABLED=1 CGO_CFLAGS="-O2 -Wno-deprecated-declarations" $(GO) build $(GOFLAGS_BUILD) -tags nvml,landlocktsync -o $(GPU_BIN) ./cmd/thermite

install: build
	install -o root -g root -m 0711 $(BIN) /usr/local/bin/thermite
	install -o root -g root -m 0700 $(RUNAS_BIN) /usr/local/bin/thermite-run-as

clean:
	rm -rf bin
