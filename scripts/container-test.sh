#!/usr/bin/env bash
# The real container test: build thermite's images with podman, run the
# harness the way compose.yaml does (every capability dropped but the
# broker's six, no-new-privileges, a state volume, the secrets read-only)
# and check from inside that the rig holds: the start, the self-test with
# its GPU rows over stand-in cards passed with --device, a trial with a lane
# command, and a timed run of the example kit. Then the one-container image
# with a RunPod variable and control's key.
#
#   sudo scripts/container-test.sh
#
# Root, Debian: installs podman, runc, jq and debootstrap when they are
# missing. Idempotent: the two base images (debootstrap of bookworm, plain
# and with gcc) are made once and kept; everything else the run makes
# (containers, volume, images, stand-in device nodes, temp folder) is removed
# at the end, whatever happens.
#
# One PASS or FAIL line per check; exits 1 if any check failed, 2 if the
# test could not run at all.
#
# Environment:
#   THERMITE_BIN              the binary to put in the image (default: `make`,
#                             then bin/thermite)
#   THERMITE_RUNAS_BIN        the light run-as client beside it (default:
#                             thermite-run-as next to THERMITE_BIN)
#   THERMITE_CTEST_BASE       the plain base, for the one-container image
#                             (default localhost/debian-base:bookworm)
#   THERMITE_CTEST_CC_BASE    the base with a C compiler, for the harness image
#                             whose judge builds the example kit
#                             (default localhost/debian-base:bookworm-gcc)
#                             Both defaults are made here with debootstrap
#                             when missing; other names must exist.
#   THERMITE_CTEST_MIRROR     the Debian mirror for debootstrap
#   THERMITE_CTEST_BASES_ONLY=1  make the base images if missing, then stop
#   THERMITE_CTEST_KEEP=1     keep the containers, the volume, the images and
#                             the temp folder to look around after a failure
#
# Podman on these machines (Linux 6.18, cgroup v1, root without
# CAP_SYS_RESOURCE):
#   - crun refuses cgroup v1 here ("cgroups in hybrid mode not supported"):
#     every podman command that runs a container takes --runtime runc.
#   - podman's default ulimits cannot be set (raising them needs
#     CAP_SYS_RESOURCE): CONTAINERS_CONF points at a file of our own with
#     default_ulimits = [].
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"

DEFAULT_BASE=localhost/debian-base:bookworm
DEFAULT_CC_BASE=localhost/debian-base:bookworm-gcc
BASE_IMAGE="${THERMITE_CTEST_BASE:-$DEFAULT_BASE}"
CC_BASE_IMAGE="${THERMITE_CTEST_CC_BASE:-$DEFAULT_CC_BASE}"
CC_PACKAGES=gcc,libc6-dev # what the example kit's build (`cc`) needs
# The Debian archive the machine's own apt sources use.
MIRROR="${THERMITE_CTEST_MIRROR:-$(grep -hoE '^(URIs:|deb) +[a-z]+://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{ print $2 }' | head -n 1)}"
RUNTIME=(--runtime runc)
WAIT_S=90 # how long the broker may take to start: its self-test runs first

say() { printf '%s\n' "$*"; }
die() {
	say "container-test: $*" >&2
	exit 2
}

# ---------------------------------------------------------------- checks
FAILS=0
CHECKS=0
pass() {
	CHECKS=$((CHECKS + 1))
	say "PASS  $1"
}
fail() {
	CHECKS=$((CHECKS + 1))
	FAILS=$((FAILS + 1))
	say "FAIL  $1"
	if [ $# -gt 1 ] && [ -n "$2" ]; then
		printf '%s\n' "$2" | sed 's/^/      | /' | head -n 40
	fi
}
# expect NAME WANT GOT [DETAIL]: PASS when GOT equals WANT.
expect() {
	if [ "$3" = "$2" ]; then pass "$1"; else fail "$1" "want: $2
got:  $3${4:+
$4}"; fi
}
# expect_has NAME NEEDLE GOT: PASS when GOT contains NEEDLE.
expect_has() {
	case "$3" in
	*"$2"*) pass "$1" ;;
	*) fail "$1" "want it to contain: $2
got: $3" ;;
	esac
}
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
now() { date +%s.%N; }
mb() { podman image inspect --format '{{.Size}}' "$1" 2>/dev/null | awk '{ printf "%d MB", $1 / 1000000 }'; }

# ---------------------------------------------------------------- set-up
[ "$(id -u)" = 0 ] || die "run as root (podman builds and runs as root here)"

need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v jq >/dev/null || need+=(jq)
for b in "$BASE_IMAGE" "$CC_BASE_IMAGE"; do
	if ! podman image exists "$b" 2>/dev/null; then
		command -v debootstrap >/dev/null || need+=(debootstrap)
		break
	fi
done
if [ ${#need[@]} -gt 0 ]; then
	command -v apt-get >/dev/null || die "needs ${need[*]} and apt-get is not here to install them"
	say "installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	if ! { apt-get update -qq >/dev/null && apt-get install -y -qq "${need[@]}" >/dev/null; }; then
		die "apt-get install ${need[*]} failed"
	fi
fi

T_START=$(now)
WORK="$(mktemp -d "${TMPDIR:-/tmp}/thermite-ctest.XXXXXX")" || die "mktemp failed"
chmod 0700 "$WORK"
ID="$(basename "$WORK" | sed 's/^thermite-ctest\.//' | tr '[:upper:]' '[:lower:]')"
P="thermite-ctest-$ID" # every name this run makes starts with it
C_HARNESS="$P-harness"
C_ONE="$P-one"
C_BADKEY="$P-badkey"
VOL_STATE="$P-state"
TAG="localhost/thermite-ctest"
IMG_BUILD_CC="$TAG:build-cc-$ID" # the build stages, tagged so that they go too
IMG_BUILD="$TAG:build-$ID"
IMG_HARNESS="$TAG:harness-$ID"
IMG_ONE="$TAG:one-container-$ID"
IMG_ONE_DEFAULT="$TAG:one-container-default-$ID"

cat >"$WORK/containers.conf" <<'EOF'
[containers]
default_ulimits = []
EOF
export CONTAINERS_CONF="$WORK/containers.conf"

# shellcheck disable=SC2317 # the EXIT trap runs it
cleanup() {
	local rc=$?
	if [ "${THERMITE_CTEST_KEEP:-}" = 1 ]; then
		say "kept: containers $C_HARNESS $C_ONE $C_BADKEY, volume $VOL_STATE, images $TAG:*-$ID, folder $WORK"
		return "$rc"
	fi
	podman rm -f -t 5 "$C_HARNESS" "$C_ONE" "$C_BADKEY" >/dev/null 2>&1
	podman volume rm -f "$VOL_STATE" >/dev/null 2>&1
	podman rmi "$IMG_HARNESS" "$IMG_ONE" "$IMG_ONE_DEFAULT" "$IMG_BUILD_CC" "$IMG_BUILD" >/dev/null 2>&1
	rm -rf "$WORK" # the stand-in device nodes are in it
	return "$rc"
}
trap cleanup EXIT
trap 'say "FAIL  container test: interrupted"; exit 130' INT TERM

# The capabilities the harness gets are compose.yaml's, read from its one-line
# cap_add list, so this test runs what the compose file says.
CAPS="$(sed -n 's/^[[:space:]]*cap_add:[[:space:]]*\[\(.*\)\][[:space:]]*\(#.*\)\{0,1\}$/\1/p' "$REPO/compose.yaml" | tr -d ' "'"'")"
[ -n "$CAPS" ] || die "compose.yaml: no one-line cap_add: [...] list found"
grep -Eq '^[[:space:]]*cap_drop:[[:space:]]*\[[[:space:]]*ALL[[:space:]]*\]' "$REPO/compose.yaml" ||
	die "compose.yaml: no cap_drop: [ALL]"
grep -Eq '^[[:space:]]*security_opt:.*no-new-privileges:true' "$REPO/compose.yaml" ||
	die "compose.yaml: no security_opt no-new-privileges:true"
# What CapEff the broker must end with: exactly those capabilities.
capmask() {
	local m=0 c b
	for c in ${1//,/ }; do
		case "$c" in
		CHOWN) b=0 ;; DAC_OVERRIDE) b=1 ;; DAC_READ_SEARCH) b=2 ;; FOWNER) b=3 ;;
		FSETID) b=4 ;; KILL) b=5 ;; SETGID) b=6 ;; SETUID) b=7 ;; SETPCAP) b=8 ;;
		CHECKPOINT_RESTORE) b=40 ;;
		*) die "compose.yaml: cap_add $c: this test knows no such capability" ;;
		esac
		m=$((m | (1 << b)))
	done
	printf '%016x' "$m"
}
WANT_CAPEFF="$(capmask "$CAPS")"

# Every container of this test runs with exactly these.
RUN_HARDENING=(--network none --cap-drop ALL --cap-add "$CAPS" --security-opt no-new-privileges)

# ---------------------------------------------------------------- base images
# debootstrap minbase of bookworm, trimmed roughly as debian:bookworm-slim
# is (no downloaded packages, package lists, manuals, translations or
# documentation but copyrights), imported. The plain one (about 25 s, 78 MB)
# and the one with gcc and libc6-dev (about 50 s, 270 MB) are made side by
# side when both are missing.
make_base() { # make_base IMAGE INCLUDE
	local image="$1" include="$2" rootfs log
	rootfs="$WORK/rootfs-${image##*:}"
	log="$WORK/debootstrap-${image##*:}.log"
	if ! debootstrap --variant=minbase ${include:+"--include=$include"} bookworm "$rootfs" "$MIRROR" >"$log" 2>&1; then
		tail -n 20 "$log" >&2
		say "container-test: debootstrap of $image failed" >&2
		return 1
	fi
	rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
		"$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/*
	find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
	if ! tar -C "$rootfs" -c . | podman import -q --change 'CMD ["/bin/bash"]' - "$image" >/dev/null; then
		say "container-test: podman import of $image failed" >&2
		return 1
	fi
	rm -rf "$rootfs"
}
T_BASE=$(now)
BASE_MADE=cached
missing_bases() {
	local b
	for b in "$BASE_IMAGE" "$CC_BASE_IMAGE"; do
		podman image exists "$b" || printf '%s\n' "$b"
	done
}
if [ -n "$(missing_bases)" ]; then
	for b in $(missing_bases); do
		case "$b" in
		"$DEFAULT_BASE" | "$DEFAULT_CC_BASE") ;;
		*) die "base image $b is not here (only $DEFAULT_BASE and $DEFAULT_CC_BASE are made here)" ;;
		esac
	done
	# One maker at a time: a second run waits and then finds them made.
	exec 9>/run/lock/thermite-ctest-base.lock
	flock 9
	pids=()
	for b in $(missing_bases); do
		say "making $b with debootstrap (once)"
		if [ "$b" = "$DEFAULT_CC_BASE" ]; then
			make_base "$b" "$CC_PACKAGES" &
		else
			make_base "$b" "" &
		fi
		pids+=($!)
		BASE_MADE=made
	done
	for pid in "${pids[@]}"; do
		wait "$pid" || die "could not make the base images"
	done
	flock -u 9
	exec 9>&-
fi
T_BASE_S=$(secs "$T_BASE" "$(now)")
say "base images $BASE_IMAGE ($(mb "$BASE_IMAGE")), $CC_BASE_IMAGE ($(mb "$CC_BASE_IMAGE")): $BASE_MADE (${T_BASE_S} s)"
if [ "${THERMITE_CTEST_BASES_ONLY:-}" = 1 ]; then
	exit 0 # CI makes the bases beside its other set-up, the test later
fi

# ---------------------------------------------------------------- configuration
# The harness image is built as a rig with two dedicated cards would build
# it: RIG_TOML gives the layout, so the image's users include the second
# timing user run-2 and its groups gpu, gpu-0 and gpu-1 (a rig.toml mounted
# at run time cannot add them: the broker refuses to start without them).
RIG_IMAGE='# the container test: two dedicated cards, one timing user each, and a
# judge CPU each (this machine has two)
timing_users = 2
judge_cpus = "0-1"

[gpu]
layout = "dedicated"'
# The one it runs with, mounted over /etc/thermite/rig.toml: the same, and
# the stand-in driver information (the runtime owns /proc, so it is mounted
# elsewhere and proc_root names it).
GPU_PROC=/run/thermite-stand-in/proc
# podman here (cgroup v1, no writable-cgroup option) gives the container a
# read-only cgroup tree: the rig runs there only with that loss accepted,
# and names it (docs/container.md says how a host gives a writable one);
# with no cpuset either, timed runs hold their CPUs by affinity alone, a
# loss accepted and named the same way. The container has no CAP_SYS_ADMIN,
# so the broker mounts no /proc of its own with hidepid: roles would see
# each other's processes there, a third loss accepted and named.
RIG_RUN="$RIG_IMAGE
dev_root = \"/dev\"
proc_root = \"$GPU_PROC\"

[host]
accept_lost = [\"cgroup-limits\", \"proc-hidepid\", \"judge-cpuset\"]"
printf '%s\n' "$RIG_RUN" >"$WORK/rig.toml"
# The one-container image is built with RIG_RUN itself: its own rig.toml
# (RIG_RUN and the [image] table the Dockerfile adds) is what it runs with.

# ---------------------------------------------------------------- images
# The build context is a folder of its own with the Dockerfile and the binary
# only: the repository's sources, .git and test files stay out of it.
if [ -z "${THERMITE_BIN:-}" ]; then
	make -s -C "$REPO" build >"$WORK/make.log" 2>&1 || { cat "$WORK/make.log" >&2; die "make build failed"; }
	THERMITE_BIN="$REPO/bin/thermite"
fi
[ -x "$THERMITE_BIN" ] || die "$THERMITE_BIN: not an executable"
THERMITE_RUNAS_BIN="${THERMITE_RUNAS_BIN:-$(dirname "$THERMITE_BIN")/thermite-run-as}"
[ -x "$THERMITE_RUNAS_BIN" ] || die "$THERMITE_RUNAS_BIN: not an executable (make build makes it beside bin/thermite)"
mkdir -p "$WORK/context/bin"
cp "$REPO/Dockerfile" "$WORK/context/Dockerfile"
cp "$THERMITE_BIN" "$WORK/context/bin/thermite"
cp "$THERMITE_RUNAS_BIN" "$WORK/context/bin/thermite-run-as"

build() { # build TARGET TAG BASE [BUILD-ARG...]
	local target="$1" tag="$2" base="$3"
	shift 3
	podman build "${RUNTIME[@]}" --network none --build-arg "BASE=$base" "$@" \
		--target "$target" -t "$tag" "$WORK/context" >"$WORK/build-$target.log" 2>&1
}
T_BUILD=$(now)
if build build "$IMG_BUILD_CC" "$CC_BASE_IMAGE" &&
	build harness "$IMG_HARNESS" "$CC_BASE_IMAGE" --build-arg "RIG_TOML=$RIG_IMAGE"; then
	pass "image builds (harness on $CC_BASE_IMAGE, with RIG_TOML: dedicated layout, 2 timing users; $(secs "$T_BUILD" "$(now)") s, $(mb "$IMG_HARNESS"))"
else
	fail "image builds (harness)" "$(tail -n 30 "$WORK"/build-*.log)"
	say "FAIL  container test: $FAILS of $CHECKS checks failed"
	exit 1
fi
out="$(podman run --rm "${RUNTIME[@]}" "${RUN_HARDENING[@]}" --entrypoint /bin/cat "$IMG_HARNESS" /etc/thermite/rig.toml 2>&1)"
expect "the harness image's /etc/thermite/rig.toml is RIG_TOML" "$RIG_IMAGE" "$out"

# ---------------------------------------------------------------- stand-ins
# Stand-in cards: character devices 1:3 (they behave like /dev/null) passed
# with --device as /dev/nvidia0, /dev/nvidia1 and the control nodes, the way
# the NVIDIA toolkit passes a card's nodes, and the driver's information
# files (UUID, bus, minor) the fence's discovery reads without NVML, mounted
# read-only at GPU_PROC. Made 0666, as a host that leaves them open does.
GPU_CARDS=2
GPU_CONTROL=(nvidiactl nvidia-uvm nvidia-uvm-tools nvidia-modeset nvidia-caps/nvidia-cap1)
gpu_setup() {
	local i n info
	mkdir -p "$WORK/dev/nvidia-caps"
	GPU_NODES=()
	for ((i = 0; i < GPU_CARDS; i++)); do
		GPU_NODES+=("nvidia$i")
		info="$WORK/gpu-proc/driver/nvidia/gpus/0000:$(printf '%02x' $((0x10 + i))):00.0"
		mkdir -p "$info"
		printf 'Model: \t\t Stand-in H200\nGPU UUID: \t GPU-00000000-0000-0000-0000-%012d\nBus Location: \t %s\nDevice Minor: \t %d\n' \
			"$i" "$(basename "$info")" "$i" >"$info/information"
	done
	chmod -R a+rX "$WORK/gpu-proc"
	GPU_NODES+=("${GPU_CONTROL[@]}")
	DEVICE_ARGS=()
	FROZEN_ARGS=()
	for n in "${GPU_NODES[@]}"; do
		mknod -m 0666 "$WORK/dev/$n" c 1 3 || die "mknod $WORK/dev/$n failed"
		DEVICE_ARGS+=(--device "$WORK/dev/$n:/dev/$n")
		FROZEN_ARGS+=(-v "$WORK/dev/$n:/dev/$n:ro")
	done
	# --device: the runtime makes the nodes in the container's /dev, where
	# the broker may change their owners and modes. Frozen: the same nodes
	# as read-only bind mounts, open to everyone, which nobody in the
	# container can change (chmod and chown: "Read-only file system"), as
	# a RunPod pod keeps its cards' nodes.
	GPU_ARGS=("${DEVICE_ARGS[@]}" -v "$WORK/gpu-proc:$GPU_PROC:ro")
	FROZEN_GPU_ARGS=("${FROZEN_ARGS[@]}" -v "$WORK/gpu-proc:$GPU_PROC:ro")
}
gpu_setup

# What the trial and the judge get, mounted read-only at /srv/thermite-ctest:
# a small project for the trial, the example kit and its project.
FIX=/srv/thermite-ctest
mkdir -p "$WORK/fixtures/project/src" "$WORK/fixtures/kits" "$WORK/fixtures/projects"
printf 'hello from %s\n' "$P" >"$WORK/fixtures/project/README"
printf 'alpha\nbeta needle\ngamma\n' >"$WORK/fixtures/project/src/main.txt"
cp -R "$REPO/examples/kits/sum" "$WORK/fixtures/kits/sum"
cp -R "$REPO/examples/projects/sum" "$WORK/fixtures/projects/sum"
chmod -R u+rwX,go+rX,go-w "$WORK/fixtures"

mkdir -m 0700 "$WORK/secrets"
(umask 077 && printf 'ctest-%s\n' "$ID" >"$WORK/secrets/ctest-token")

podman volume create "$VOL_STATE" >/dev/null || die "podman volume create failed"

# run_rig NAME IMAGE [PODMAN-RUN-ARG...] [-- CMD...]: a rig container as
# compose.yaml runs it: its capabilities, no-new-privileges, the state
# volume, the secrets read-only.
run_rig() {
	local name="$1" image="$2" args=() cmd=()
	shift 2
	while [ $# -gt 0 ] && [ "$1" != -- ]; do
		args+=("$1")
		shift
	done
	[ $# -gt 0 ] && shift && cmd=("$@")
	podman run -d --name "$name" "${RUNTIME[@]}" "${RUN_HARDENING[@]}" \
		-v "$VOL_STATE:/var/lib/thermite" \
		-v "$WORK/secrets:/etc/thermite/secrets:ro" \
		"${args[@]}" "$image" "${cmd[@]}" >/dev/null
}
# cx NAME CMD...: a command inside the container, as root there.
cx() {
	local c="$1"
	shift
	podman exec "$c" "$@"
}
# wait_ready NAME: until `thermite status` says the controller answers.
wait_ready() {
	local c="$1" deadline=$((SECONDS + WAIT_S)) out=""
	while [ $SECONDS -lt $deadline ]; do
		if [ "$(podman inspect --format '{{.State.Running}}' "$c" 2>/dev/null)" != true ]; then
			READY_DETAIL="the container stopped (exit $(podman inspect --format '{{.State.ExitCode}}' "$c" 2>/dev/null)):
$(podman logs "$c" 2>&1 | tail -n 20)"
			return 1
		fi
		if out="$(cx "$c" thermite status 2>&1)" && printf '%s\n' "$out" | grep -Eq '^controller +pid [0-9]+, answers'; then
			return 0
		fi
		sleep 0.3
	done
	READY_DETAIL="no answer in ${WAIT_S} s; last status:
$out
$(podman logs "$c" 2>&1 | tail -n 20)"
	return 1
}
# proc_field NAME PID FIELD: a field of /proc/PID/status inside the container.
proc_field() {
	cx "$1" sed -n "s/^$3:[[:space:]]*//p" "/proc/$2/status" 2>/dev/null
}
# procs_of NAME UID: how many processes of that uid run in the container.
procs_of() {
	# shellcheck disable=SC2016 # expanded inside the container
	cx "$1" sh -c 'n=0; for f in /proc/[0-9]*/status; do
		awk -v u="$1" '"'"'$1 == "Uid:" && $2 == u { found = 1 } END { exit !found }'"'"' "$f" 2>/dev/null && n=$((n + 1))
	done; echo $n' sh "$2"
}

# selftest NAME: `thermite selftest isolation --json` inside; sets ST (the
# JSON) and ST_RC.
selftest() {
	ST="$(cx "$1" thermite selftest isolation --json 2>"$WORK/selftest.err")"
	ST_RC=$?
	if ! printf '%s' "$ST" | jq -e .probes >/dev/null 2>&1; then
		ST="{\"holds\": false, \"sentence\": $(jq -Rs . <"$WORK/selftest.err"), \"probes\": []}"
	fi
}
st_holds() { # PASS when the last self-test holds, exited 0 and no row failed
	local what="$1" sentence bad n why='\(([^()]|\([^()]*\))*\)'
	sentence="$(jq -r .sentence <<<"$ST")"
	n="$(jq '.probes | length' <<<"$ST")"
	bad="$(jq -r '.probes[] | select(.ok | not) | "\(.role): \(.attempt): got \(.got), want \(.expect)"' <<<"$ST")"
	if [ "$ST_RC" = 0 ] && [ "$(jq -r .holds <<<"$ST")" = true ] && [ -z "$bad" ] &&
		{ [[ "$sentence" =~ ^isolation\ holds:\ every\ probe\ of\ [0-9]+\ roles\ came\ out\ as\ it\ must$ ]] ||
			# The losses rig.toml accepts here (podman's read-only cgroup
			# tree, so no cpuset; no CAP_SYS_ADMIN, so no /proc of the
			# broker's own), named as the kernel policy names them, and
			# no other.
			# A reason may hold one level of parentheses of its own; without a
			# cgroup tree the CPU weights are off too, said after.
			[[ "$sentence" =~ ^isolation\ holds,\ without:\ cgroup-limits\ $why,\ proc-hidepid\ $why,\ judge-cpuset\ $why\;\ every\ other\ probe\ of\ [0-9]+\ roles\ came\ out\ as\ it\ must(\;\ CPU\ weights\ off:\ [^\;]*)?$ ]]; }; then
		pass "$what: $sentence ($n rows, exit 0)"
	else
		fail "$what (exit $ST_RC)" "$sentence
$bad"
	fi
}
# st_rows PREFIX: the rows whose attempt starts with PREFIX: "N OKCOUNT".
st_rows() {
	jq -r --arg a "$1" '[.probes[] | select(.attempt | startswith($a))] | "\(length) \(map(select(.ok)) | length)"' <<<"$ST"
}

# The rig's own checks: the broker, the controller, a role's command, the
# self-test, the image's set-id files, the secrets.
rig_checks() {
	local c="$1" out pid
	out="$(cx "$c" thermite status --json 2>&1)"
	pid="$(jq -r '.broker_pid // empty' <<<"$out" 2>/dev/null)"
	if [ -z "$pid" ]; then
		fail "broker's pid from thermite status --json" "$out"
	else
		expect "broker is PID 1 of the container" 1 "$pid"
		expect "broker CapEff is $WANT_CAPEFF" "$WANT_CAPEFF" "$(proc_field "$c" "$pid" CapEff)"
		expect "broker CapBnd is $WANT_CAPEFF" "$WANT_CAPEFF" "$(proc_field "$c" "$pid" CapBnd)"
		expect "broker NoNewPrivs is 1" 1 "$(proc_field "$c" "$pid" NoNewPrivs)"
	fi
	local cpid want_uid
	cpid="$(jq -r '.controller_pid // empty' <<<"$out" 2>/dev/null)"
	want_uid="$(cx "$c" thermite roles | awk '$1 == "thermite" { print $3 }')"
	if [ -z "$cpid" ] || [ "$cpid" = 0 ]; then
		fail "controller's pid from thermite status --json" "$out"
	else
		expect "controller runs as thermite (uid $want_uid), with no capability and NoNewPrivs 1" \
			"$want_uid $want_uid $want_uid $want_uid|0000000000000000|1" \
			"$(proc_field "$c" "$cpid" Uid | tr -s '\t ' '  ')|$(proc_field "$c" "$cpid" CapEff)|$(proc_field "$c" "$cpid" NoNewPrivs)"
	fi

	# A role's command, through the broker.
	local lane_uid
	lane_uid="$(cx "$c" thermite roles | awk '$1 == "lane-1" { print $3 }')"
	out="$(cx "$c" thermite run-as lane-1 -- id -u 2>&1)"
	expect "thermite run-as lane-1 -- id -u prints lane-1's uid" "${lane_uid:-lane-1 missing from thermite roles}" "$out"
	out="$(cx "$c" thermite-run-as lane-1 -- id -u 2>&1)"
	expect "thermite-run-as lane-1 -- id -u prints lane-1's uid" "${lane_uid:-lane-1 missing from thermite roles}" "$out"

	out="$(cx "$c" thermite roles 2>&1)"
	local n
	n="$(printf '%s\n' "$out" | awk 'NR > 1' | grep -c .)"
	if printf '%s\n' "$out" | head -n 1 | grep -q '^ROLE' && printf '%s\n' "$out" | grep -q '^supervisor '; then
		pass "thermite roles lists $n roles"
	else
		fail "thermite roles lists the role table" "$out"
	fi
	# Every role is a user of the image, with the table's uid.
	local missing
	# shellcheck disable=SC2016 # expanded inside the container
	missing="$(cx "$c" sh -c 'thermite roles | awk "NR > 1 { print \$2, \$3 }" | while read -r u id; do
		[ "$(id -u "$u" 2>/dev/null)" = "$id" ] || echo "$u"; done' 2>&1)"
	expect "every role of the table is a user of the image with its uid" "" "$missing"

	out="$(cx "$c" find / -xdev -perm /6000 -type f 2>&1)"
	expect "no set-user-id or set-group-id file in the image (find / -xdev -perm /6000 -type f)" "" "$out"
	expect "thermite is root:root 0711 at /usr/local/bin/thermite" "root:root 711" \
		"$(cx "$c" stat -c '%U:%G %a' /usr/local/bin/thermite 2>&1)"
	expect "thermite-run-as is root:root 0700 at /usr/local/bin/thermite-run-as" "root:root 700" \
		"$(cx "$c" stat -c '%U:%G %a' /usr/local/bin/thermite-run-as 2>&1)"

	# The secrets: read-only here, and the broker read the one secret.
	out="$(cx "$c" sh -c ': > /etc/thermite/secrets/ctest-write' 2>&1)"
	if printf '%s\n' "$out" | grep -q 'Read-only file system'; then
		pass "the secrets folder is mounted read-only"
	else
		fail "the secrets folder is mounted read-only" "${out:-the write succeeded}"
	fi
	if podman logs "$c" 2>&1 | grep '"secrets read"' | grep -q '"count":1'; then
		pass "the broker read the one secret (root 0600 in a root 0700 folder)"
	else
		fail "the broker read the one secret" "$(podman logs "$c" 2>&1 | grep -i secret | tail -n 5)"
	fi
}

# run_probes NAME "ROLE|FLAGS|OP|PATH[|...]"...: `thermite run-as ROLE FLAGS
# -- thermite __probe try OP PATH` for each, all in one exec so that the
# container is entered once; one line each: the probe's verdict (ok,
# EACCES…), then what it saw.
run_probes() {
	local c="$1" args=() k role flags op path
	shift
	for k in "$@"; do
		IFS='|' read -r role flags op path _ <<<"$k"
		args+=("$role" "$flags" "$op" "$path")
	done
	# shellcheck disable=SC2016 # expanded inside the container
	cx "$c" sh -c 'while [ $# -ge 4 ]; do
		out=$(thermite run-as "$1" $2 -- thermite __probe try "$3" "$4" </dev/null 2>&1)
		printf "%s\n" "$(printf "%s" "$out" | tr "\n" " ")"
		shift 4
	done' sh "${args[@]}" 2>&1
}

# gpu_checks NAME: the GPU fence inside the container, over the stand-in
# cards: the layout, each role's opens and ioctls, the refusals, the device
# files' owners, and the self-test with its GPU rows.
gpu_checks() {
	local c="$1" n got g want=""
	for n in "${GPU_NODES[@]}"; do
		want="${want}/dev/$n character special file 1:3
"
	done
	got="$(cx "$c" stat -c '%n %F %t:%T' "${GPU_NODES[@]/#//dev/}" 2>&1)"
	expect "the ${#GPU_NODES[@]} stand-in GPU nodes are in the container (--device, character devices 1:3)" "${want%
}" "$got"

	g="$(cx "$c" thermite gpus --json 2>&1)"
	got="$(jq -r '"\(.layout) usable=\(.usable) cards=\(.cards | length) control=\(.control_nodes | length) discovery=\(.discovery | split(" ")[0]) abi>=5:\(.fence_abi >= 5)"' <<<"$g" 2>&1)"
	expect "thermite gpus --json: the dedicated layout is usable with $GPU_CARDS cards and ${#GPU_CONTROL[@]} control nodes" \
		"dedicated usable=true cards=$GPU_CARDS control=${#GPU_CONTROL[@]} discovery=dev abi>=5:true" "$got" "$g"
	got="$(jq -r '[.grants[] | "\(.card):\(.roles | join(","))"] | join(" ")' <<<"$g" 2>&1)"
	case "$got" in
	"0:run"* | *" 0:run"*) pass "card grants: $got" ;;
	*) fail "card 0 is granted to run, card 1 to run-2" "$got" ;;
	esac

	# Who may open what: each line "ROLE|FLAGS|OP|PATH|WANT", all run in one
	# exec so that the container is entered once.
	local cases=(
		"run|--gpus 0|open-dev|/dev/nvidia0|ok"
		"run|--gpus 0|ioctl3|/dev/nvidia0|ok"
		"run|--gpus 0|open-dev|/dev/nvidiactl|ok"
		"run|--gpus 0|open-dev|/dev/nvidia1|EACCES"
		"run|--gpus 0|ioctl3|/dev/nvidia1|EACCES"
		"run-2|--gpus 1|open-dev|/dev/nvidia1|ok"
		"run-2|--gpus 1|open-dev|/dev/nvidia0|EACCES"
		"run-2|--gpus 1|ioctl3|/dev/nvidia0|EACCES"
		"lane-1||open-dev|/dev/nvidia0|EACCES"
		"lane-1||ioctl3|/dev/nvidia1|EACCES"
		"lane-1||open-dev|/dev/nvidiactl|EACCES"
		"lane-1||open-dev|/dev/nvidia-caps/nvidia-cap1|EACCES"
		"builder||ioctl3|/dev/nvidia0|EACCES"
		"agent-1||open-dev|/dev/nvidia1|EACCES"
		"supervisor||open-dev|/dev/nvidia0|EACCES"
		"thermite||ioctl3|/dev/nvidia1|EACCES"
	)
	local k role flags op path want
	mapfile -t got_lines < <(run_probes "$c" "${cases[@]}")
	local i=0
	for k in "${cases[@]}"; do
		IFS='|' read -r role flags op path want <<<"$k"
		# The probe prints its verdict first, then what it saw.
		got="${got_lines[$i]:-}"
		expect "run-as $role${flags:+ $flags} -- thermite __probe try $op $path: $want" "$want" "${got%% *}" "$got"
		i=$((i + 1))
	done

	# The broker refuses what the layout does not give.
	out="$(cx "$c" thermite run-as run --gpus 1 -- true 2>&1)"
	got=$?
	expect_has "run-as run --gpus 1 is refused (exit $got): card 1 is run-2's" "gpus: run may not open card 1 (its timing user is run-2)" "$out"
	out="$(cx "$c" thermite run-as builder --gpus 0 -- true 2>&1)"
	expect_has "run-as builder --gpus 0 is refused" "gpus: builder may not open GPUs" "$out"
	# shellcheck disable=SC2016 # expanded inside the container
	out="$(cx "$c" thermite run-as run-2 --gpus 1 -- sh -c 'echo "$CUDA_VISIBLE_DEVICES $(id -G | wc -w)"' 2>&1)"
	expect "run-2 --gpus 1: CUDA_VISIBLE_DEVICES is card 1's UUID, 3 groups (its own, gpu, gpu-1)" \
		"GPU-00000000-0000-0000-0000-000000000001 3" "$out"

	# The device files: put in their groups where the container lets the
	# broker change them; otherwise the fence alone keeps roles off them.
	local fixable note
	fixable="$(jq -r .device_permissions_fixable <<<"$g")"
	note="$(jq -r '.device_permissions_note // ""' <<<"$g")"
	got="$(cx "$c" stat -c '%n %U:%G %a' /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl 2>&1 | tr '\n' ';')"
	if [ "$fixable" = true ]; then
		expect "device permissions CAN be changed in this container: the broker made the nodes root:gpu-N / root:gpu 0660" \
			"/dev/nvidia0 root:gpu-0 660;/dev/nvidia1 root:gpu-1 660;/dev/nvidiactl root:gpu 660;" "$got"
		# Opened again behind its back: before the next run with a card,
		# the broker puts it back.
		out="$(cx "$c" sh -c 'chmod 0666 /dev/nvidia1 && thermite run-as run-2 --gpus 1 -- true && stat -c "%U:%G %a" /dev/nvidia1' 2>&1)"
		expect "a node opened to everyone (chmod 0666 /dev/nvidia1) is put back before the next run with a card" "root:gpu-1 660" "$out"
	else
		local st
		st="$(cx "$c" thermite status 2>&1)"
		if [[ "$st" == *"device permissions cannot be changed"*"the fence alone keeps roles off the cards"* ]]; then
			pass "device permissions CANNOT be changed in this container; thermite status says so: $note"
		else
			fail "device permissions: not fixable, and thermite status says why" "$note
$st"
		fi
	fi

	# The self-test, as an operator runs it inside the container, with its
	# GPU rows: every role tries every card and control node.
	selftest "$c"
	st_holds "thermite selftest isolation --json holds with the dedicated layout"
	st_gpu_rows "harness"
}

# st_gpu_rows WHAT: the last self-test's GPU rows (every row whose attempt
# names a card or the GPU): at least 3 per role, every role has some, all
# ok, and each kind of GPU row is there.
st_gpu_rows() {
	local roles_n rows ok_rows bad k n got
	roles_n="$(jq -r .roles <<<"$ST")"
	read -r rows ok_rows < <(jq -r '[.probes[] | select(.attempt | test("card|GPU"))] | "\(length) \(map(select(.ok)) | length)"' <<<"$ST")
	bad="$(jq -r --argjson n "${roles_n:-0}" '[.probes[] | select(.attempt | test("card|GPU")) | .role] | unique | length as $r | if $r < $n then "GPU rows for only \($r) of \($n) roles" else empty end' <<<"$ST")"
	if [ "${rows:-0}" -ge $((3 * ${roles_n:-1})) ] && [ "$rows" = "$ok_rows" ] && [ -z "$bad" ]; then
		pass "$1: self-test GPU rows: $rows, all ok, every one of $roles_n roles tried the cards"
	else
		fail "$1: self-test GPU rows: at least 3 per role, all ok" "rows $rows, ok $ok_rows, roles $roles_n $bad"
	fi
	for k in "open the card it was given" "see exactly the one card it was given" "open a card it was not given" \
		"ioctl a card it was not given" "open a GPU control node without a card"; do
		read -r n got < <(st_rows "$k")
		if [ "${n:-0}" -gt 0 ] && [ "$n" = "$got" ]; then
			pass "$1: self-test rows \"$k\": $n, all ok"
		else
			fail "$1: self-test rows \"$k\"" "$n rows, $got ok"
		fi
	done
}

# frozen_gpu_checks NAME: the cards' nodes as a pod keeps them, open to
# everyone and unchangeable: the broker says it cannot change them, they
# stay 0666, and the fence alone keeps every role but the card's own off
# them; the supervisor gets no card.
frozen_gpu_checks() {
	local c="$1" g got st
	g="$(cx "$c" thermite gpus --json 2>&1)"
	got="$(jq -r '"\(.layout) usable=\(.usable) cards=\(.cards | length) fixable=\(.device_permissions_fixable)"' <<<"$g" 2>&1)"
	expect "frozen nodes: thermite gpus --json: dedicated, usable, $GPU_CARDS cards, device permissions not fixable" \
		"dedicated usable=true cards=$GPU_CARDS fixable=false" "$got" "$g"
	st="$(cx "$c" thermite status 2>&1)"
	if [[ "$st" == *"device permissions cannot be changed"*"the fence alone keeps roles off the cards"* ]]; then
		pass "frozen nodes: thermite status: $(printf '%s\n' "$st" | grep -o 'device permissions cannot be changed.*' | head -n 1)"
	else
		fail "frozen nodes: thermite status says device permissions cannot be changed and the fence alone keeps roles off the cards" "$st"
	fi
	got="$(run_probes "$c" "run|--gpus 0|open-dev|/dev/nvidia0" "run|--gpus 0|open-dev|/dev/nvidia1" \
		"run-2|--gpus 1|ioctl3|/dev/nvidia0" "supervisor||open-dev|/dev/nvidia0" "supervisor||ioctl3|/dev/nvidia1" \
		"supervisor||open-dev|/dev/nvidiactl" "lane-1||open-dev|/dev/nvidia0" "agent-1||ioctl3|/dev/nvidia1")"
	expect "frozen nodes: run opens card 0 and not card 1, run-2 not card 0, the supervisor no card and no control node, lane-1 and agent-1 no card" \
		"ok EACCES EACCES EACCES EACCES EACCES EACCES EACCES " "$(printf '%s\n' "$got" | awk '{ printf "%s ", $1 }')" "$got"
	out="$(cx "$c" thermite run-as supervisor --gpus 0 -- true 2>&1)"
	expect_has "frozen nodes: run-as supervisor --gpus 0 is refused" "gpus: supervisor may not open GPUs" "$out"
	got="$(cx "$c" stat -c '%n %U:%G %a' /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl 2>&1 | tr '\n' ';')"
	expect "frozen nodes: they stayed root:root 0666 (only the fence kept the roles off)" \
		"/dev/nvidia0 root:root 666;/dev/nvidia1 root:root 666;/dev/nvidiactl root:root 666;" "$got"
}

# trial_checks NAME: a trial on lane 1, from start to end.
trial_checks() {
	local c="$1" out id ws tok lane_uid rc
	lane_uid="$(cx "$c" thermite roles | awk '$1 == "lane-1" { print $3 }')"
	out="$(cx "$c" thermite trial start --lane 1 --project "$FIX/project" --json 2>&1)"
	id="$(jq -r '.id // empty' <<<"$out" 2>/dev/null)"
	ws="$(jq -r '.workspace // empty' <<<"$out" 2>/dev/null)"
	tok="$(jq -r '.token_file // empty' <<<"$out" 2>/dev/null)"
	if [ -z "$id" ] || [ -z "$ws" ]; then
		fail "thermite trial start --lane 1 --project $FIX/project --json" "$out"
		return
	fi
	pass "trial start on lane 1: $id, workspace $ws"
	expect "the workspace is lane-1's, 0700" "lane-1 700" "$(cx "$c" stat -c '%U %a' "$ws" 2>&1)"

	out="$(cx "$c" thermite trial exec "$id" -- id -u 2>&1)"
	expect "trial exec -- id -u prints lane-1's uid" "$lane_uid" "$out"
	out="$(cx "$c" thermite trial exec "$id" -- sh -c 'pwd; cat README; grep -c needle src/main.txt' 2>&1)"
	expect "trial exec runs in the workspace, the project's fresh copy" "$ws
hello from $P
1" "$out"
	out="$(cx "$c" thermite trial exec "$id" -- sh -c 'echo made > made.txt && cat made.txt' 2>&1)"
	expect "trial exec writes in its workspace, as lane-1" "made|lane-1" "$out|$(cx "$c" stat -c %U "$ws/made.txt" 2>&1)"
	cx "$c" thermite trial exec "$id" -- sh -c 'exit 7' >/dev/null 2>&1
	rc=$?
	expect "trial exec exits with the command's code (sh -c 'exit 7')" 7 "$rc"

	local p bad=""
	for p in /etc/ctest-$ID /var/lib/thermite/ctest-$ID /var/lib/thermite/controller/ctest-$ID "$(dirname "$ws")/ctest-$ID" /usr/local/bin/ctest-$ID; do
		out="$(cx "$c" thermite trial exec "$id" -- sh -c ": > '$p'" 2>&1)"
		rc=$?
		if [ $rc = 0 ] || cx "$c" test -e "$p"; then
			bad="$bad$p: written (exit $rc) $out
"
			cx "$c" rm -f "$p"
		elif [[ "$out" != *"Permission denied"* && "$out" != *"Read-only"* ]]; then
			bad="$bad$p: exit $rc but: $out
"
		fi
	done
	expect "trial exec cannot write outside its workspace (/etc, the state folder, the controller's, the trial's folder, /usr/local/bin): Permission denied" "" "$bad"
	if [ -n "$tok" ]; then
		out="$(cx "$c" thermite trial exec "$id" -- cat "$tok" 2>&1)"
		expect_has "trial exec cannot read the trial's agent token ($tok)" "Permission denied" "$out"
	fi

	# A leftover: lanes' processes live until the trial ends.
	cx "$c" thermite trial exec "$id" -- sh -c 'sleep 600 </dev/null >/dev/null 2>&1 &' >/dev/null 2>&1
	n="$(procs_of "$c" "$lane_uid")"
	if [ "${n:-0}" -ge 1 ]; then
		pass "a lane-1 process left running by trial exec lives on until the trial ends ($n)"
	else
		fail "a lane-1 process left running by trial exec lives on until the trial ends" "lane-1 processes: $n"
	fi
	out="$(cx "$c" thermite trial end "$id" --reason "container test" 2>&1)"
	rc=$?
	expect "thermite trial end $id exits 0" 0 "$rc" "$out"
	local deadline=$((SECONDS + 10))
	n="$(procs_of "$c" "$lane_uid")"
	while [ "${n:-1}" != 0 ] && [ $SECONDS -lt $deadline ]; do
		sleep 0.2
		n="$(procs_of "$c" "$lane_uid")"
	done
	expect "after trial end, no lane-1 process is left in the container" 0 "$n"
	out="$(cx "$c" thermite trial list --json 2>&1)"
	got="$(jq -r --arg id "$id" '(if type == "array" then . else (.trials // []) end)[] | select(.id == $id) | (.state // .status // "?")' <<<"$out" 2>&1)"
	if [ -n "$got" ] && [ "$got" != "running" ] && [ "$got" != "active" ] && [ "$got" != "?" ]; then
		pass "trial list --json: $id is $got"
	else
		fail "trial list --json shows the trial ended" "$got
$out"
	fi
}

# kit_checks NAME: a timed run of the example kit: import, build (cc, as
# builder, inside the container), time (as run on the judge CPUs), check.
kit_checks() {
	local c="$1" out bid rc t0
	t0=$(now)
	out="$(cx "$c" thermite kit import "$FIX/kits/sum" 2>&1)"
	rc=$?
	expect "thermite kit import $FIX/kits/sum" "0 kit sum imported" "$rc $(printf '%s' "$out" | cut -d: -f1)" "$out"
	t0=$(now)
	out="$(cx "$c" thermite judge build --kit sum --project "$FIX/projects/sum" --json 2>&1)"
	rc=$?
	bid="$(jq -r '.id // empty' <<<"$out" 2>/dev/null)"
	if [ $rc = 0 ] && [ -n "$bid" ]; then
		pass "judge build --kit sum: $bid, $(jq -r '.manifest | length' <<<"$out" 2>/dev/null) file(s), cc run as builder in the container ($(secs "$t0" "$(now)") s)"
	else
		fail "judge build --kit sum --project $FIX/projects/sum (exit $rc)" "$out"
		return
	fi
	t0=$(now)
	out="$(cx "$c" thermite judge time "$bid" --kit sum --json 2>&1)"
	rc=$?
	got="$(jq -r '"\(.status) \(.public_score)"' <<<"$out" 2>/dev/null)"
	expect "judge time $bid --kit sum: status scored, public score 1 ($(jq -r '"\(.repeats | length) repeats, median \(.median_wall_ns / 1e6 | floor) ms, as \(.role // "?") on CPUs \(.cpus // "?")"' <<<"$out" 2>/dev/null); $(secs "$t0" "$(now)") s)" \
		"0 scored 1" "$rc $got" "$out"
	out="$(jq -r '.check_output // ""' <<<"$out" 2>/dev/null)"
	if [[ "$out" == *case1* && "$out" != *case3* ]]; then
		pass "the timed run's check output names the public cases and not the hidden case3"
	else
		fail "the timed run's check output names the public cases and not the hidden case3" "$out"
	fi
}

# stop_check NAME: SIGTERM to the broker; it must stop everything and exit 0
# well before podman's own SIGKILL.
stop_check() {
	local c="$1" t0 code
	t0=$(now)
	podman stop -t 20 "$c" >/dev/null 2>&1
	code="$(podman inspect --format '{{.State.ExitCode}}' "$c" 2>&1)"
	expect "SIGTERM: the broker stops the rig and exits 0 ($(secs "$t0" "$(now)") s)" 0 "$code" \
		"$(podman logs "$c" 2>&1 | tail -n 10)"
}

# ---------------------------------------------------------------- harness
say "--- harness ($IMG_HARNESS, container $C_HARNESS)"
T_RUN=$(now)
if ! run_rig "$C_HARNESS" "$IMG_HARNESS" -v "$WORK/rig.toml:/etc/thermite/rig.toml:ro" \
	-v "$WORK/fixtures:$FIX:ro" "${GPU_ARGS[@]}"; then
	fail "podman run the harness" "$(podman logs "$C_HARNESS" 2>&1 | tail -n 20)"
elif wait_ready "$C_HARNESS"; then
	pass "broker up, controller answers ($(secs "$T_RUN" "$(now)") s, start-up self-test included)"
	T_SECTION=$(now)
	rig_checks "$C_HARNESS"
	say "      (rig checks: $(secs "$T_SECTION" "$(now)") s)"
	T_SECTION=$(now)
	gpu_checks "$C_HARNESS"
	say "      (GPU checks: $(secs "$T_SECTION" "$(now)") s)"
	T_SECTION=$(now)
	trial_checks "$C_HARNESS"
	say "      (trial: $(secs "$T_SECTION" "$(now)") s)"
	T_SECTION=$(now)
	kit_checks "$C_HARNESS"
	say "      (kit: $(secs "$T_SECTION" "$(now)") s)"
	stop_check "$C_HARNESS"
else
	fail "broker up and the controller answers" "$READY_DETAIL"
fi

# ---------------------------------------------------------------- one-container
# The image RunPod runs: on the plain base, the supervisor's place, the
# [image] table in its own rig.toml. Run as a pod is: a RunPod variable in
# its environment, control's key handed in with the SHA-256 the launch
# names, the stand-in cards passed open to everyone.
say "--- one-container ($IMG_ONE, container $C_ONE)"
RUNPOD_VALUE="rp-ctest-$ID-secret"
KEY_IN=/run/thermite-ctest/control.pub
printf 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI%s control@%s\n' "$ID" "$P" >"$WORK/control.pub"
chmod 0644 "$WORK/control.pub"
KEY_SHA="$(sha256sum "$WORK/control.pub" | cut -d' ' -f1)"
T_BUILD1=$(now)
if build build "$IMG_BUILD" "$BASE_IMAGE" && build one-container "$IMG_ONE" "$BASE_IMAGE" --build-arg "RIG_TOML=$RIG_RUN"; then
	pass "image builds (one-container on $BASE_IMAGE, with RIG_TOML: the dedicated layout over the stand-ins; $(secs "$T_BUILD1" "$(now)") s, $(mb "$IMG_ONE"))"
	out="$(podman run --rm "${RUNTIME[@]}" "${RUN_HARDENING[@]}" --entrypoint /bin/stat "$IMG_ONE" \
		-c '%n %U:%G %a' /var/lib/thermite-supervisor /var/lib/thermite-supervisor/token /var/lib/thermite-inbox /var/lib/thermite-outbox /etc/thermite/rig.toml 2>&1)"
	expect "the supervisor's place: its folder 0700 and token 0600, inbox supervisor:thermite 2750, outbox thermite:supervisor 2750, rig.toml root 0644" \
		"/var/lib/thermite-supervisor supervisor:supervisor 700
/var/lib/thermite-supervisor/token supervisor:supervisor 600
/var/lib/thermite-inbox supervisor:thermite 2750
/var/lib/thermite-outbox thermite:supervisor 2750
/etc/thermite/rig.toml root:root 644" "$out"
	out="$(podman run --rm "${RUNTIME[@]}" "${RUN_HARDENING[@]}" "$IMG_ONE" config 2>&1)"
	expect "thermite config in the image reads its rig.toml: RIG_TOML's layout and the [image] table's one_container = true" \
		"layout = \"dedicated\"|proc_root = \"$GPU_PROC\"|one_container = true" \
		"$(printf '%s\n' "$out" | sed -n '/^\[host\]/,/^\[/d; s/^[[:space:]]*\(layout = .*\|proc_root = .*\|one_container = .*\)$/\1/p' | paste -sd'|')" "$out"

	# The same rig serves from this image: the state volume is the harness's,
	# now stopped, so this also shows a restart on old state.
	if ! run_rig "$C_ONE" "$IMG_ONE" -e "RUNPOD_API_KEY=$RUNPOD_VALUE" -e "RUNPOD_POD_ID=$P" \
		-v "$WORK/control.pub:$KEY_IN:ro" "${FROZEN_GPU_ARGS[@]}" \
		-- serve --control-key "$KEY_IN" --control-key-sha256 "$KEY_SHA"; then
		fail "podman run the one-container image" "$(podman logs "$C_ONE" 2>&1 | tail -n 20)"
	elif wait_ready "$C_ONE"; then
		pass "one-container: broker up with RUNPOD_API_KEY set and --control-key-sha256 $KEY_SHA, controller answers"
		c="$C_ONE"
		out="$(podman inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$c" | grep -c '^RUNPOD_')"
		expect "the container was given the RunPod variables (podman inspect: RUNPOD_API_KEY, RUNPOD_POD_ID)" 2 "$out"
		bpid="$(cx "$c" thermite status --json | jq -r '.broker_pid // empty')"
		cpid="$(cx "$c" thermite status --json | jq -r '.controller_pid // empty')"
		# Read from the host: the broker is not dumpable, so not even the
		# container's root (no CAP_SYS_PTRACE) may read its environ.
		out=""
		for pid in "$bpid" "$cpid"; do
			hp="$(podman top "$c" pid hpid 2>/dev/null | awk -v p="$pid" '$1 == p { print $2 }')"
			if [ -n "$hp" ] && [ -r "/proc/$hp/environ" ] && grep -qa PATH= "/proc/$hp/environ"; then
				out="$out$pid:$(tr '\0' '\n' <"/proc/$hp/environ" | grep -c '^RUNPOD_') "
			else
				out="$out$pid:unreadable(host pid ${hp:-?}) "
			fi
		done
		expect "no RUNPOD_ variable in the broker's (pid $bpid) or the controller's (pid $cpid) /proc/PID/environ, read from the host" "$bpid:0 $cpid:0 " "$out"
		out="$(cx "$c" sh -c 'thermite run-as lane-1 -- env; thermite run-as supervisor -- env' 2>&1)"
		if [[ "$out" == *PATH=* && "$out" != *RUNPOD* && "$out" != *"$RUNPOD_VALUE"* ]]; then
			pass "no RUNPOD_ variable in lane-1's or the supervisor's environment"
		else
			fail "no RUNPOD_ variable in lane-1's or the supervisor's environment" "$(printf '%s\n' "$out" | grep -e RUNPOD -e "$RUNPOD_VALUE")"
		fi
		out="$(cx "$c" sh -c 'stat -c "%U:%G %a" /var/lib/thermite/control/key && sha256sum </var/lib/thermite/control/key' 2>&1)"
		expect "control's key copy: root:thermite 0640 at /var/lib/thermite/control/key, with the SHA-256 the launch named" \
			"root:thermite 640
$KEY_SHA  -" "$out"
		out="$(cx "$c" thermite run-as supervisor -- sh -c 'id -un; cat /var/lib/thermite-supervisor/token && echo read' 2>&1)"
		expect "thermite run-as supervisor: runs as supervisor and reads its own token" "supervisor
read" "$out"
		out="$(cx "$c" thermite run-as lane-1 -- cat /var/lib/thermite-supervisor/token 2>&1)"
		expect_has "thermite run-as lane-1 cannot read the supervisor's token" "Permission denied" "$out"
		frozen_gpu_checks "$c"
		out="$(cx "$c" find / -xdev -perm /6000 -type f 2>&1)"
		expect "one-container: no set-user-id or set-group-id file" "" "$out"

		selftest "$c"
		st_holds "one-container: thermite selftest isolation --json holds"
		st_gpu_rows "one-container"
		for k in "no file in the image keeps a set-id bit" \
			"control's key copy is root's, writable by nobody else, and matches its SHA-256" \
			"read the supervisor's folder" "read the supervisor's token" "read the outbox" "write the inbox" \
			"no host variable in its environment" "the broker's environment has no host variable"; do
			read -r n got < <(st_rows "$k")
			if [ "${n:-0}" -gt 0 ] && [ "$n" = "$got" ]; then
				pass "one-container self-test row \"$k\": $n, all ok"
			else
				fail "one-container self-test row \"$k\" is there and ok" "$n rows, $got ok"
			fi
		done
		# The set-id row is live: a set-user-id file planted in the image
		# makes the self-test fail and name it.
		planted=/usr/local/bin/thermite-ctest-setid
		if cx "$c" sh -c "cp /bin/true $planted && chmod 4755 $planted" 2>/dev/null; then
			selftest "$c"
			cx "$c" rm -f "$planted"
			out="$(jq -r '.probes[] | select(.attempt | startswith("no file in the image keeps a set-id bit")) | "\(.ok) \(.got)"' <<<"$ST")"
			if [ "$ST_RC" != 0 ] && [[ "$out" == false*"$planted"* ]] && [[ "$(jq -r .sentence <<<"$ST")" == *"$planted"* ]]; then
				pass "a set-user-id file planted in the image: the self-test does NOT hold and names it (exit $ST_RC)"
			else
				fail "a set-user-id file planted in the image fails the self-test" "exit $ST_RC: $out
$(jq -r .sentence <<<"$ST")"
			fi
		else
			fail "plant a set-user-id file in the one-container (chmod 4755)" ""
		fi
		stop_check "$c"
	else
		fail "one-container: broker up and the controller answers" "$READY_DETAIL"
	fi

	# Control's key with another SHA-256 than the launch named: the start is
	# refused before anything runs.
	BAD_SHA="$(printf 'not the key' | sha256sum | cut -d' ' -f1)"
	podman run -d --name "$C_BADKEY" "${RUNTIME[@]}" "${RUN_HARDENING[@]}" -e "RUNPOD_API_KEY=$RUNPOD_VALUE" \
		-v "$WORK/control.pub:$KEY_IN:ro" "$IMG_ONE" \
		serve --control-key "$KEY_IN" --control-key-sha256 "$BAD_SHA" >/dev/null 2>&1
	code="$(timeout 30 podman wait "$C_BADKEY" 2>&1)"
	out="$(podman logs "$C_BADKEY" 2>&1)"
	if [ -n "$code" ] && [ "$code" != 0 ] && [[ "$out" == *"has SHA-256 $KEY_SHA, not the $BAD_SHA the launch named: refusing to start"* ]]; then
		pass "a wrong --control-key-sha256: the container exits $code, the log names the mismatch"
	else
		fail "a wrong --control-key-sha256 refuses the start" "exit ${code:-none (still running?)}
$out"
	fi
else
	fail "image builds (one-container)" "$(tail -n 30 "$WORK/build-build.log" "$WORK/build-one-container.log")"
fi

# The same target without RIG_TOML, as a plain `build --target
# one-container .` makes it: the embedded defaults and the [image] table.
T_BUILD1=$(now)
if build one-container "$IMG_ONE_DEFAULT" "$BASE_IMAGE"; then
	out="$(podman run --rm "${RUNTIME[@]}" "${RUN_HARDENING[@]}" "$IMG_ONE_DEFAULT" config 2>&1)"
	got="$(printf '%s\n' "$out" | sed -n 's/^[[:space:]]*\(timing_users = .*\|layout = .*\|one_container = .*\)$/\1/p' | paste -sd'|')"
	got="$got|$(podman run --rm "${RUNTIME[@]}" "${RUN_HARDENING[@]}" "$IMG_ONE_DEFAULT" roles 2>&1 | awk 'NR > 1' | grep -c .) roles"
	expect "one-container without RIG_TOML ($(secs "$T_BUILD1" "$(now)") s): the defaults (one timing user, no GPU layout, 38 roles) and one_container = true" \
		"timing_users = 1|layout = \"none\"|one_container = true|38 roles" "$got" "$out"
else
	fail "image builds (one-container without RIG_TOML)" "$(tail -n 30 "$WORK/build-one-container.log")"
fi

# ---------------------------------------------------------------- verdict
TOTAL_S=$(secs "$T_START" "$(now)")
say "      images: harness $(mb "$IMG_HARNESS") on $CC_BASE_IMAGE ($(mb "$CC_BASE_IMAGE")), one-container $(mb "$IMG_ONE") on $BASE_IMAGE ($(mb "$BASE_IMAGE"))"
if [ $FAILS = 0 ]; then
	say "PASS  container test: all $CHECKS checks passed (${TOTAL_S} s)"
	exit 0
fi
say "FAIL  container test: $FAILS of $CHECKS checks failed (${TOTAL_S} s)"
exit 1
