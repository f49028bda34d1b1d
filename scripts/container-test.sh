#!/usr/bin/env bash
# The real container test: build thermite's images with podman, run the
# harness the way compose.yaml does (every capability dropped but the
# broker's six, no-new-privileges, a state volume, the secrets read-only)
# and check from inside that the rig holds. Then the one-container image.
#
#   sudo scripts/container-test.sh
#
# Root, Debian: installs podman, runc and debootstrap when they are missing.
# Idempotent: the base image (debootstrap of bookworm, about 25 s) is made
# once and kept as localhost/debian-base:bookworm; everything else the run
# makes (containers, volume, images, stand-in device nodes, temp folder) is
# removed at the end, whatever happens.
#
# One PASS or FAIL line per check; exits 1 if any check failed, 2 if the
# test could not run at all.
#
# Environment:
#   THERMITE_BIN            the binary to put in the image (default: `make`,
#                           then bin/thermite)
#   THERMITE_CTEST_BASE     the base image (default localhost/debian-base:bookworm,
#                           made here with debootstrap when missing)
#   THERMITE_CTEST_MIRROR   the Debian mirror for debootstrap
#   THERMITE_CTEST_KEEP=1   keep the containers and the temp folder to look
#                           around after a failure (they are named below)
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

BASE_IMAGE="${THERMITE_CTEST_BASE:-localhost/debian-base:bookworm}"
MIRROR="${THERMITE_CTEST_MIRROR:-http://deb.debian.org/debian}"
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
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
now() { date +%s.%N; }

# ---------------------------------------------------------------- set-up
[ "$(id -u)" = 0 ] || die "run as root (podman builds and runs as root here)"

need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
if ! podman image exists "$BASE_IMAGE" 2>/dev/null; then
	command -v debootstrap >/dev/null || need+=(debootstrap)
fi
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
VOL_STATE="$P-state"
TAG="localhost/thermite-ctest"
IMG_BUILD="$TAG:build-$ID"
IMG_HARNESS="$TAG:harness-$ID"
IMG_ONE="$TAG:one-container-$ID"

cat >"$WORK/containers.conf" <<'EOF'
[containers]
default_ulimits = []
EOF
export CONTAINERS_CONF="$WORK/containers.conf"

# shellcheck disable=SC2317 # the EXIT trap runs it
cleanup() {
	local rc=$?
	if [ "${THERMITE_CTEST_KEEP:-}" = 1 ]; then
		say "kept: containers $C_HARNESS $C_ONE, volume $VOL_STATE, folder $WORK"
		return "$rc"
	fi
	podman rm -f -t 5 "$C_HARNESS" "$C_ONE" >/dev/null 2>&1
	podman volume rm -f "$VOL_STATE" >/dev/null 2>&1
	podman rmi "$IMG_HARNESS" "$IMG_ONE" "$IMG_BUILD" >/dev/null 2>&1
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
		*) die "compose.yaml: cap_add $c: this test knows no such capability" ;;
		esac
		m=$((m | (1 << b)))
	done
	printf '%016x' "$m"
}
WANT_CAPEFF="$(capmask "$CAPS")"

RUN_HARDENING=(--network none --cap-drop ALL --cap-add "$CAPS" --security-opt no-new-privileges)

# ---------------------------------------------------------------- base image
T_BASE=$(now)
BASE_MADE=cached
if ! podman image exists "$BASE_IMAGE"; then
	case "$BASE_IMAGE" in
	localhost/debian-base:bookworm) ;;
	*) die "base image $BASE_IMAGE is not here (only localhost/debian-base:bookworm is made here)" ;;
	esac
	# One maker at a time: a second run waits and then finds it made.
	exec 9>/run/lock/thermite-ctest-base.lock
	flock 9
	if ! podman image exists "$BASE_IMAGE"; then
		say "making $BASE_IMAGE with debootstrap (once; about 25 s)"
		ROOTFS="$WORK/rootfs"
		debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
			{ tail -n 20 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
		# Roughly what debian:bookworm-slim leaves out: downloaded packages,
		# package lists, manuals, translations, documentation but copyrights.
		rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
			"$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* "$ROOTFS"/usr/share/locale/*
		find "$ROOTFS/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
		tar -C "$ROOTFS" -c . | podman import -q --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null ||
			die "podman import of the base failed"
		rm -rf "$ROOTFS"
		BASE_MADE=made
	fi
	flock -u 9
	exec 9>&-
fi
T_BASE_S=$(secs "$T_BASE" "$(now)")
say "base image $BASE_IMAGE: $BASE_MADE (${T_BASE_S} s)"

# ---------------------------------------------------------------- images
# The build context is a folder of its own with the Dockerfile and the binary
# only: the repository's sources, .git and test files stay out of it.
if [ -z "${THERMITE_BIN:-}" ]; then
	make -s -C "$REPO" build >"$WORK/make.log" 2>&1 || { cat "$WORK/make.log" >&2; die "make build failed"; }
	THERMITE_BIN="$REPO/bin/thermite"
fi
[ -x "$THERMITE_BIN" ] || die "$THERMITE_BIN: not an executable"
mkdir -p "$WORK/context/bin"
cp "$REPO/Dockerfile" "$WORK/context/Dockerfile"
cp "$THERMITE_BIN" "$WORK/context/bin/thermite"

build() { # build TARGET TAG
	podman build "${RUNTIME[@]}" --network none --build-arg "BASE=$BASE_IMAGE" \
		--target "$1" -t "$2" "$WORK/context" >"$WORK/build-$1.log" 2>&1
}
T_BUILD=$(now)
if build build "$IMG_BUILD" && build harness "$IMG_HARNESS"; then
	pass "image builds (harness, $(secs "$T_BUILD" "$(now)") s)"
else
	fail "image builds (harness)" "$(tail -n 30 "$WORK"/build-*.log)"
	say "FAIL  container test: $FAILS of $CHECKS checks failed"
	exit 1
fi
SIZE="$(podman image inspect --format '{{.Size}}' "$IMG_HARNESS")"
say "      image size: $((SIZE / 1000000)) MB (base $(($(podman image inspect --format '{{.Size}}' "$BASE_IMAGE") / 1000000)) MB)"

# ---------------------------------------------------------------- harness
# The GPU section. Stand-in cards: character devices 1:3 (they behave like
# /dev/null) passed in as /dev/nvidia0, /dev/nvidia1 and the control nodes,
# the way the NVIDIA toolkit passes a card's nodes, and the driver's
# information files (UUID, minor) the fence's discovery reads when NVML is
# not there, mounted read-only at GPU_PROC (not /proc, which the runtime
# owns). The GPU fence's checks extend this section: set RIG_TOML to a
# [gpu] layout with proc_root = "$GPU_PROC", and add them to gpu_checks.
GPU_CARDS=2
GPU_CONTROL=(nvidiactl nvidia-uvm)
GPU_PROC=/run/thermite-stand-in/proc
RIG_TOML="" # /etc/thermite/rig.toml in the container; empty: the embedded defaults
gpu_setup() {
	local i n info
	mkdir -p "$WORK/dev"
	GPU_NODES=()
	for ((i = 0; i < GPU_CARDS; i++)); do
		GPU_NODES+=("nvidia$i")
		info="$WORK/gpu-proc/driver/nvidia/gpus/0000:$(printf '%02x' $((0x10 + i))):00.0"
		mkdir -p "$info"
		printf 'Model: \t\t Stand-in H200\nGPU UUID: \t GPU-00000000-0000-0000-0000-%012d\nBus Location: \t %s\nDevice Minor: \t %d\n' \
			"$i" "$(basename "$info")" "$i" >"$info/information"
	done
	GPU_NODES+=("${GPU_CONTROL[@]}")
	DEVICE_ARGS=()
	for n in "${GPU_NODES[@]}"; do
		mknod -m 0666 "$WORK/dev/$n" c 1 3 || die "mknod $WORK/dev/$n failed"
		DEVICE_ARGS+=(--device "$WORK/dev/$n:/dev/$n")
	done
	DEVICE_ARGS+=(-v "$WORK/gpu-proc:$GPU_PROC:ro")
}
gpu_setup

mkdir -m 0700 "$WORK/secrets"
(umask 077 && printf 'ctest-%s\n' "$ID" >"$WORK/secrets/ctest-token")
CONFIG_ARGS=()
if [ -n "$RIG_TOML" ]; then
	printf '%s\n' "$RIG_TOML" >"$WORK/rig.toml"
	CONFIG_ARGS=(-v "$WORK/rig.toml:/etc/thermite/rig.toml:ro")
fi

podman volume create "$VOL_STATE" >/dev/null || die "podman volume create failed"

# run_harness NAME IMAGE: the harness as compose.yaml runs it.
run_harness() {
	podman run -d --name "$1" "${RUNTIME[@]}" "${RUN_HARDENING[@]}" \
		-v "$VOL_STATE:/var/lib/thermite" \
		-v "$WORK/secrets:/etc/thermite/secrets:ro" \
		"${CONFIG_ARGS[@]}" "${DEVICE_ARGS[@]}" "$2" >/dev/null
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
		sleep 0.5
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
json_int() { # json_int KEY < json
	sed -n "s/^ *\"$1\": *\([0-9-]*\).*/\1/p" | head -n 1
}

# The rig's own checks: the broker, the controller, a role's command, the
# self-test, the image's set-id files, the secrets.
rig_checks() {
	local c="$1" out pid
	out="$(cx "$c" thermite status --json 2>&1)"
	pid="$(printf '%s\n' "$out" | json_int broker_pid)"
	if [ -z "$pid" ]; then
		fail "broker's pid from thermite status --json" "$out"
	else
		expect "broker is PID 1 of the container" 1 "$pid"
		expect "broker CapEff is $WANT_CAPEFF" "$WANT_CAPEFF" "$(proc_field "$c" "$pid" CapEff)"
		expect "broker CapBnd is $WANT_CAPEFF" "$WANT_CAPEFF" "$(proc_field "$c" "$pid" CapBnd)"
		expect "broker NoNewPrivs is 1" 1 "$(proc_field "$c" "$pid" NoNewPrivs)"
	fi
	local cpid want_uid
	cpid="$(printf '%s\n' "$out" | json_int controller_pid)"
	want_uid="$(cx "$c" thermite roles | awk '$1 == "thermite" { print $3 }')"
	if [ -z "$cpid" ] || [ "$cpid" = 0 ]; then
		fail "controller's pid from thermite status --json" "$out"
	else
		expect "controller runs as thermite (uid $want_uid), with no capability and NoNewPrivs 1" \
			"$want_uid $want_uid $want_uid $want_uid|0000000000000000|1" \
			"$(proc_field "$c" "$cpid" Uid | tr -s '\t ' '  ')|$(proc_field "$c" "$cpid" CapEff)|$(proc_field "$c" "$cpid" NoNewPrivs)"
	fi

	# The self-test, as an operator runs it inside the container.
	local rc
	out="$(cx "$c" thermite selftest isolation 2>&1)"
	rc=$?
	if [ $rc = 0 ] && printf '%s\n' "$out" | grep -Eq '^isolation holds: every probe of [0-9]+ roles came out as it must$'; then
		pass "thermite selftest isolation: $(printf '%s\n' "$out" | grep '^isolation holds')"
	else
		fail "thermite selftest isolation holds and exits 0 (exit $rc)" "$out"
	fi

	# A role's command, through the broker.
	local lane_uid
	lane_uid="$(cx "$c" thermite roles | awk '$1 == "lane-1" { print $3 }')"
	out="$(cx "$c" thermite run-as lane-1 -- id -u 2>&1)"
	expect "thermite run-as lane-1 -- id -u prints lane-1's uid" "${lane_uid:-lane-1 missing from thermite roles}" "$out"

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

# gpu_checks NAME: the GPU section's checks. For now: the stand-in nodes and
# the driver information are there. The GPU fence (issue 4) adds here: the
# layout usable in `thermite status`, `run-as run` opening /dev/nvidia0 and
# refused /dev/nvidia1 (dedicated), a lane refused a card without --gpus,
# the nodes' owners and groups put back, and the self-test's GPU rows.
gpu_checks() {
	local c="$1" n got
	for n in "${GPU_NODES[@]}"; do
		got="$(cx "$c" stat -c '%F %t:%T' "/dev/$n" 2>&1)"
		expect "stand-in GPU node /dev/$n is in the container (character device 1:3)" "character special file 1:3" "$got"
	done
	got="$(cx "$c" sh -c "grep -h '^Device Minor' $GPU_PROC/driver/nvidia/gpus/*/information | wc -l" 2>&1)"
	expect "stand-in driver information for $GPU_CARDS cards at $GPU_PROC" "$GPU_CARDS" "$got"
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

say "--- harness ($IMG_HARNESS, container $C_HARNESS)"
T_RUN=$(now)
if ! run_harness "$C_HARNESS" "$IMG_HARNESS"; then
	fail "podman run the harness" "$(podman logs "$C_HARNESS" 2>&1 | tail -n 20)"
elif wait_ready "$C_HARNESS"; then
	pass "broker up, controller answers ($(secs "$T_RUN" "$(now)") s, start-up self-test included)"
	rig_checks "$C_HARNESS"
	gpu_checks "$C_HARNESS"
	stop_check "$C_HARNESS"
else
	fail "broker up and the controller answers" "$READY_DETAIL"
fi

# ---------------------------------------------------------------- one-container
say "--- one-container ($IMG_ONE, container $C_ONE)"
T_BUILD1=$(now)
if build one-container "$IMG_ONE"; then
	pass "image builds (one-container, $(secs "$T_BUILD1" "$(now)") s)"
	out="$(podman run --rm "${RUNTIME[@]}" "${RUN_HARDENING[@]}" --entrypoint /bin/stat "$IMG_ONE" \
		-c '%n %U:%G %a' /var/lib/thermite-supervisor /var/lib/thermite-inbox /var/lib/thermite-outbox 2>&1)"
	expect "the supervisor's folders: its own 0700, inbox supervisor:thermite 2750, outbox thermite:supervisor 2750" \
		"/var/lib/thermite-supervisor supervisor:supervisor 700
/var/lib/thermite-inbox supervisor:thermite 2750
/var/lib/thermite-outbox thermite:supervisor 2750" "$out"
	# The same rig serves from this image: the state volume is the harness's,
	# now stopped, so this also shows a restart on old state.
	if ! run_harness "$C_ONE" "$IMG_ONE"; then
		fail "podman run the one-container image" "$(podman logs "$C_ONE" 2>&1 | tail -n 20)"
	elif wait_ready "$C_ONE"; then
		pass "one-container: broker up, controller answers"
		out="$(cx "$C_ONE" find / -xdev -perm /6000 -type f 2>&1)"
		expect "one-container: no set-user-id or set-group-id file" "" "$out"
		out="$(cx "$C_ONE" thermite selftest isolation 2>&1)"
		if printf '%s\n' "$out" | grep -Eq '^isolation holds: every probe of [0-9]+ roles came out as it must$'; then
			pass "one-container: thermite selftest isolation holds"
		else
			fail "one-container: thermite selftest isolation holds" "$out"
		fi
		expect "one-container: thermite run-as supervisor -- id -un" supervisor \
			"$(cx "$C_ONE" thermite run-as supervisor -- id -un 2>&1)"
		stop_check "$C_ONE"
	else
		fail "one-container: broker up and the controller answers" "$READY_DETAIL"
	fi
else
	fail "image builds (one-container)" "$(tail -n 30 "$WORK/build-one-container.log")"
fi

# ---------------------------------------------------------------- verdict
TOTAL_S=$(secs "$T_START" "$(now)")
if [ $FAILS = 0 ]; then
	say "PASS  container test: all $CHECKS checks passed (${TOTAL_S} s)"
	exit 0
fi
say "FAIL  container test: $FAILS of $CHECKS checks failed (${TOTAL_S} s)"
exit 1
