#!/usr/bin/env bash
# Runs every fuzz target (func FuzzX in a *_test.go file) for FUZZTIME
# each (default 10s), one after another, and exits non-zero if any fails.
# A failing input is written by go test under the package's
# testdata/fuzz/FuzzX/: commit it with the fix, as a regression case.
# Needs no root. FUZZPARALLEL sets the workers per target (default: all
# CPUs); FUZZ picks targets by an extended regexp on their names;
# FUZZMINIMIZETIME bounds minimizing an input (default 5s, not go test's
# 60s, which would eat a short run's whole budget on one input).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
fuzztime=${FUZZTIME:-10s}
minimize=${FUZZMINIMIZETIME:-5s}
filter=${FUZZ:-.}
parallel=()
if [[ -n "${FUZZPARALLEL:-}" ]]; then
	parallel=(-parallel "$FUZZPARALLEL")
fi

# Every "dir name" pair, found in the source so that a new target needs
# no change here.
mapfile -t targets < <(grep -rHoE --include='*_test.go' --exclude-dir=testdata '^func Fuzz[A-Za-z0-9_]*\(' . |
	sed -E 's#^\./(.*)/[^/]+:func (Fuzz[A-Za-z0-9_]*)\($#\1 \2#' | grep -E " ($filter)" | sort -u)
if [[ ${#targets[@]} -eq 0 ]]; then
	echo "fuzz: no fuzz target matches ${filter}" >&2
	exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=()
start=$SECONDS
for t in "${targets[@]}"; do
	dir=${t% *}
	name=${t#* }
	echo "=== $name (./$dir, $fuzztime)"
	ok=0
	if go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" "${parallel[@]}" "./$dir" >"$log" 2>&1; then
		ok=1
	elif ! grep -q 'Failing input written to' "$log" && grep -q '^    context deadline exceeded$' "$log"; then
		# go test's coordinator, not the target: a worker still busy with
		# an input when -fuzztime ran out is reported this way, with no
		# failing input. Said, and run once more; a real failure writes
		# its input under testdata and is never retried.
		echo "fuzz: $name: the run ended on go test's own deadline with no failing input; once more"
		if go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" "${parallel[@]}" "./$dir" >"$log" 2>&1; then
			ok=1
		fi
	fi
	if [[ $ok == 1 ]]; then
		# The last progress line: executions, their rate, corpus size.
		grep '^fuzz: elapsed' "$log" | tail -n 1
	else
		cat "$log"
		failed+=("$name (./$dir)")
	fi
done
echo "fuzz: ${#targets[@]} targets in $((SECONDS - start))s"
if [[ ${#failed[@]} -gt 0 ]]; then
	printf 'fuzz: FAILED: %s\n' "${failed[@]}" >&2
	exit 1
fi
