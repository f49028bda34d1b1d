#!/usr/bin/env bash
# Runs thermite's benchmarks (as root) and prints each figure beside its
# peer, measured in the same run, as a ratio. These machines are shared and
# noisy: compare ratios, not absolute times.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
n=${BENCH_N:-200}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# A benchmark that fails (the flood's bounds) leaves its figures printed
# and fails the script at the end, not before the table.
status=0
run() { go test -run '^$' "$@" | tee -a "$out" >&2 || status=1; }
run -bench 'RunTrue|StopUser500|Fence|Policy|Selftest|API' -benchtime "${n}x" -timeout 60m ./e2e/rig/
run -bench 'Start' -benchtime "${n}x" -timeout 30m ./internal/spawn/
run -bench 'TimingNoise' -benchtime 1x -timeout 30m ./e2e/rig/
run -bench 'Flood$' -benchtime 1x -timeout 30m ./e2e/rig/
run -bench 'SetIDSweep100k' -benchtime 10x -timeout 30m ./internal/confined/
run -bench 'Hash1GiB' -benchtime 3x -timeout 30m ./internal/hashtree/
run -bench 'Load' -benchtime "${n}x" -timeout 10m ./internal/seccomp/
awk '
/^Benchmark/ {
	name=$1; sub(/-[0-9]+$/, "", name); ns[name]=$3
	for (i = 4; i < NF; i++) if ($(i+1) ~ /^(p50-µs|p99-µs|cv%-pinned|cv%-unpinned|MB\/s|full\/exec|setpriv\/exec|broker-lane\/exec|broker-lane-dial\/exec|broker-cpu-µs\/run|broker-switches\/run|run-as\/setpriv|run-as-light\/setpriv|no-cgroup\/exec|µs-dispatch|µs-linear|µs-allow|roles|wall-ms|exec-µs|uid-vs-exec-µs|rlimits-cpus-µs|landlock-µs|seccomp-µs|cgroups-µs|cpu-ms|idle-p99-µs|flooded-p99-µs|ratio-p99|errors|pause-ms|ctl-cpu%-flooded|ctl-runqueue%-flooded|judge-build-idle-ms|judge-build-flooded-ms|judge-time-idle-ms|judge-time-flooded-ms|judge-wait-idle-µs|judge-wait-flooded-µs|judge-starts-ahead)$/) metric[name, $(i+1)] = $i
}
function row(label, a, b, aim) {
	if ((a in ns) && (b in ns)) printf "%-52s %12.3f ms %12.3f ms %7.2fx   %s\n", label, ns[a]/1e6, ns[b]/1e6, ns[a]/ns[b], aim
}
function p50(label, a, b, aim) {
	if (((a, "p50-µs") in metric) && ((b, "p50-µs") in metric))
		printf "%-52s %9d µs p50 %9d µs p50 %7.2fx   %s (p99 %d / %d µs)\n", label, metric[a, "p50-µs"], metric[b, "p50-µs"], metric[a, "p50-µs"]/metric[b, "p50-µs"], aim, metric[a, "p99-µs"], metric[b, "p99-µs"]
}
END {
	printf "%-52s %15s %15s %8s   %s\n", "what (against its peer)", "thermite", "peer", "ratio", "aim"
	row("spawn.Start /bin/true, the full lane start vs os/exec", "BenchmarkStart/spawn-lane-full", "BenchmarkStart/exec", "<= 1.5x")
	if (("BenchmarkStart/interleaved", "full/exec") in metric) printf "%-52s %28s %7.2fx   %s (setpriv %.2fx)\n", "  the same, taken in turn (medians)", "", metric["BenchmarkStart/interleaved", "full/exec"], "<= 1.5x", metric["BenchmarkStart/interleaved", "setpriv/exec"]
	if (("BenchmarkStartSteps", "full/exec") in metric) {
		m = "BenchmarkStartSteps"
		printf "%-52s %9.0f µs exec; uid switch %+.0f, rlimits and CPUs %+.0f, Landlock %+.0f, seccomp %+.0f, cgroups %+.0f µs (%.2fx)\n", "  a lane start, step by step (medians)", metric[m, "exec-µs"], metric[m, "uid-vs-exec-µs"], metric[m, "rlimits-cpus-µs"], metric[m, "landlock-µs"], metric[m, "seccomp-µs"], metric[m, "cgroups-µs"], metric[m, "full/exec"]
	}
	row("  setpriv --reuid /bin/true vs os/exec", "BenchmarkStart/setpriv", "BenchmarkStart/exec", "(peer)")
	row("  bwrap --ro-bind / / /bin/true vs os/exec", "BenchmarkStart/bwrap", "BenchmarkStart/exec", "(peer)")
	row("Run /bin/true as a lane (broker round trip) vs os/exec", "BenchmarkRunTrue/broker-lane", "BenchmarkRunTrue/exec", "<= 1.15x (issue 29)")
	if (("BenchmarkRunTrue/interleaved", "broker-lane/exec") in metric) printf "%-52s %28s %7.2fx   %s (setpriv %.2fx)\n", "  the same, taken in turn (medians)", "", metric["BenchmarkRunTrue/interleaved", "broker-lane/exec"], "<= 1.15x (issue 29)", metric["BenchmarkRunTrue/interleaved", "setpriv/exec"]
	if (("BenchmarkRunTrue/interleaved", "broker-lane-dial/exec") in metric) printf "%-52s %28s %7.2fx   %s\n", "  the same, a new connection per Run (rpc.Call)", "", metric["BenchmarkRunTrue/interleaved", "broker-lane-dial/exec"], "(as run-as makes it)"
	if (("BenchmarkRunTrue/broker-lane", "broker-cpu-µs/run") in metric) printf "%-52s %28s %8.0f µs, %.1f switches\n", "  CPU and context switches of the broker per Run", "", metric["BenchmarkRunTrue/broker-lane", "broker-cpu-µs/run"], metric["BenchmarkRunTrue/broker-lane", "broker-switches/run"]
	if (("BenchmarkRunTrue/broker-lane-no-cgroup", "no-cgroup/exec") in metric) printf "%-52s %28s %7.2fx   %s\n", "  the same on a rig without cgroups (no v1 writes)", "", metric["BenchmarkRunTrue/broker-lane-no-cgroup", "no-cgroup/exec"], "(what v1 placement costs)"
	row("setpriv --reuid /bin/true vs os/exec", "BenchmarkRunTrue/setpriv", "BenchmarkRunTrue/exec", "(peer)")
	row("bwrap --ro-bind / / /bin/true vs os/exec", "BenchmarkRunTrue/bwrap", "BenchmarkRunTrue/exec", "(peer)")
	row("thermite run-as lane-1 -- /bin/true vs setpriv", "BenchmarkRunTrue/run-as", "BenchmarkRunTrue/setpriv", "<= 1.3x, or hands over (issue 29)")
	if (("BenchmarkRunTrue/interleaved", "run-as/setpriv") in metric) printf "%-52s %28s %7.2fx   %s\n", "  the same, taken in turn (medians)", "", metric["BenchmarkRunTrue/interleaved", "run-as/setpriv"], "<= 1.3x, or hands over (issue 29)"
	row("thermite-run-as lane-1 -- /bin/true vs setpriv", "BenchmarkRunTrue/run-as-light", "BenchmarkRunTrue/setpriv", "<= 1.0x (issue 29)")
	if (("BenchmarkRunTrue/interleaved", "run-as-light/setpriv") in metric) printf "%-52s %28s %7.2fx   %s\n", "  the same, taken in turn (medians)", "", metric["BenchmarkRunTrue/interleaved", "run-as-light/setpriv"], "<= 1.0x (issue 29)"
	row("Run with the GPU fence vs no rule set", "BenchmarkFence/fenced", "BenchmarkFence/unfenced", "< 1.10x")
	row("Run with the full policy vs the fence only", "BenchmarkPolicy/full", "BenchmarkPolicy/fence-only", "< 1.25x")
	row("set-id sweep, 100k files vs find -perm /6000", "BenchmarkSetIDSweep100k/thermite", "BenchmarkSetIDSweep100k/find", "<= 1.2x")
	row("hash 1 GiB vs sha256sum (time; lower is faster)", "BenchmarkHash1GiB/hashtree", "BenchmarkHash1GiB/sha256sum", "<= 1.11x")
	p50("API read 4 KiB, 1 client vs os.ReadFile", "BenchmarkAPI/read/api-1", "BenchmarkAPI/read/direct", "p50 < 1 ms")
	p50("API read 4 KiB, 16 lanes vs os.ReadFile", "BenchmarkAPI/read/api-16", "BenchmarkAPI/read/direct", "")
	p50("API exec /bin/true, 1 client vs bare Run", "BenchmarkAPI/exec/api-1", "BenchmarkAPI/exec/bare-run", "<= 2x")
	p50("API exec /bin/true, 16 lanes vs bare Run", "BenchmarkAPI/exec/api-16", "BenchmarkAPI/exec/bare-run", "")
	p50("bare Run vs os/exec", "BenchmarkAPI/exec/bare-run", "BenchmarkAPI/exec/direct", "")
	row("StopUser of 500 processes, cgroup vs helper alone", "BenchmarkStopUser500/cgroup", "BenchmarkStopUser500/helper", "(v2: cgroup.kill)")
	if (("BenchmarkLoad", "µs-dispatch") in metric) printf "%-52s %9.1f µs p50 %9.1f µs p50 %7.2fx   %s (ALLOW alone %.1f µs)\n", "seccomp filter attach, dispatch vs the linear list", metric["BenchmarkLoad", "µs-dispatch"], metric["BenchmarkLoad", "µs-linear"], metric["BenchmarkLoad", "µs-dispatch"]/metric["BenchmarkLoad", "µs-linear"], "", metric["BenchmarkLoad", "µs-allow"]
	if (("BenchmarkFlood", "ratio-p99") in metric) printf "%-52s %9d µs p99 %9d µs p99 %7.2fx   %s (errors %d; pause between requests %d ms; controller %.0f%% CPU, %.0f%% waiting for one)\n", "lane 16 API calls p99, 15 lanes flooding vs idle", metric["BenchmarkFlood", "flooded-p99-µs"], metric["BenchmarkFlood", "idle-p99-µs"], metric["BenchmarkFlood", "ratio-p99"], "<= 2x, 0 errors", metric["BenchmarkFlood", "errors"], metric["BenchmarkFlood", "pause-ms"], metric["BenchmarkFlood", "ctl-cpu%-flooded"], metric["BenchmarkFlood", "ctl-runqueue%-flooded"]
	if (("BenchmarkFlood", "judge-build-idle-ms") in metric) {
		printf "%-52s %12.0f ms %12.0f ms %7.2fx   %s\n", "judge build, 15 lanes flooding vs idle", metric["BenchmarkFlood", "judge-build-flooded-ms"], metric["BenchmarkFlood", "judge-build-idle-ms"], metric["BenchmarkFlood", "judge-build-flooded-ms"]/metric["BenchmarkFlood", "judge-build-idle-ms"], "(printed)"
		printf "%-52s %12.0f ms %12.0f ms %7.2fx   %s\n", "judge time (5 repeats), 15 lanes flooding vs idle", metric["BenchmarkFlood", "judge-time-flooded-ms"], metric["BenchmarkFlood", "judge-time-idle-ms"], metric["BenchmarkFlood", "judge-time-flooded-ms"]/metric["BenchmarkFlood", "judge-time-idle-ms"], "(printed)"
		printf "%-52s %12.0f µs %12.0f µs %7.2fx   %s (starts of others ahead: %d)\n", "  a timed repeat, the longest wait for its start", metric["BenchmarkFlood", "judge-wait-flooded-µs"], metric["BenchmarkFlood", "judge-wait-idle-µs"], metric["BenchmarkFlood", "judge-wait-flooded-µs"]/metric["BenchmarkFlood", "judge-wait-idle-µs"], "0 starts ahead", metric["BenchmarkFlood", "judge-starts-ahead"]
	}
	for (k = 10; k <= 38; k += 28) {
		s = "BenchmarkSelftest/roles-" k
		if ((s, "wall-ms") in metric) printf "%-52s %12.0f ms %28s   %s (CPU %.0f ms)\n", "isolation self-test, " k " roles (its own wall time)", metric[s, "wall-ms"], "", (k == 38 ? "<= 1000 ms on a quiet machine" : ""), metric[s, "cpu-ms"]
	}
	if (("BenchmarkTimingNoise", "cv%-pinned") in metric) printf "%-52s %11.2f %% pinned, %.2f %% unpinned\n", "timing noise: CV of 20 repeats, a lane loading", metric["BenchmarkTimingNoise", "cv%-pinned"], metric["BenchmarkTimingNoise", "cv%-unpinned"]
}' "$out"
exit $status
