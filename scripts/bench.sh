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
go test -run '^$' -bench 'RunTrue|StopUser500' -benchtime "${n}x" -timeout 30m ./cmd/thermite/ | tee -a "$out" >&2
go test -run '^$' -bench 'SetIDSweep100k' -benchtime 10x -timeout 30m ./internal/confined/ | tee -a "$out" >&2
for p in ./selftest/ ./broker/ ./controller/ ./fence/; do
	[ -d "$p" ] && go test -run '^$' -bench . -benchtime "${n}x" -timeout 30m "$p" 2>/dev/null | grep '^Benchmark' | tee -a "$out" >&2 || true
done
awk '
/^Benchmark/ { name=$1; sub(/-[0-9]+$/, "", name); ns[name]=$3 }
function row(label, a, b, aim) {
	if ((a in ns) && (b in ns)) printf "%-48s %10.3f ms %10.3f ms %7.2fx   %s\n", label, ns[a]/1e6, ns[b]/1e6, ns[a]/ns[b], aim
}
END {
	printf "%-48s %13s %13s %8s   %s\n", "what (against its peer)", "thermite", "peer", "ratio", "aim"
	row("Run /bin/true as a lane vs os/exec", "BenchmarkRunTrue/broker-lane", "BenchmarkRunTrue/exec", "<= 2x")
	row("setpriv --reuid /bin/true vs os/exec", "BenchmarkRunTrue/setpriv", "BenchmarkRunTrue/exec", "(peer)")
	row("bwrap --ro-bind / / /bin/true vs os/exec", "BenchmarkRunTrue/bwrap", "BenchmarkRunTrue/exec", "(peer)")
	row("set-id sweep, 100k files vs find -perm /6000", "BenchmarkSetIDSweep100k/thermite", "BenchmarkSetIDSweep100k/find", "<= 1.2x")
	row("Run with the GPU fence vs without", "BenchmarkFence/fenced", "BenchmarkFence/unfenced", "< 1.10x")
	row("Run with the full policy vs fence only", "BenchmarkPolicy/full", "BenchmarkPolicy/fence-only", "< 1.25x")
	if ("BenchmarkStopUser500" in ns) printf "%-48s %10.3f ms %13s %8s   %s\n", "StopUser of 500 processes", ns["BenchmarkStopUser500"]/1e6, "-", "-", "< 50 ms"
	if ("BenchmarkSelftest" in ns) printf "%-48s %10.3f ms %13s %8s   %s\n", "isolation self-test, default table", ns["BenchmarkSelftest"]/1e6, "-", "-", "< 2000 ms"
}' "$out"
