#!/usr/bin/env bash
# e2e/vm/run.sh boots Debian's 6.12 kernel under qemu (software emulation,
# no KVM needed) with statically built test binaries in an initramfs, once
# per ia32_emulation mode, and checks TestI386ABIKilled: with
# ia32_emulation=false int 0x80 faults and the test must skip with its
# reason; with ia32_emulation=true it must pass. Every other test in the
# binaries must pass or skip.
#
# Exit status: 0 all as expected, 1 a check failed, 77 this machine cannot
# run the check (no root, no qemu, no kernel package), with a line saying why.
#
# Environment:
#   THERMITE_VM_CACHE     kernel, apt lists and work files (/var/cache/thermite-vm)
#   THERMITE_SRC          module root to build the tests from (this repository)
#   THERMITE_VM_MODES     ia32_emulation values to boot with ("false true")
#   THERMITE_VM_PACKAGES  packages whose tests run in the VM (./internal/seccomp)
#   THERMITE_VM_RUN       -test.run pattern inside the VM (all)
#   THERMITE_VM_SMP       virtual CPUs (2)
#   THERMITE_VM_TIMEOUT   seconds one boot may take (900)
#   THERMITE_VM_PREPARE   1: fetch the kernel and busybox, boot nothing
set -euo pipefail
export PATH=/usr/local/go/bin:$PATH
export DEBIAN_FRONTEND=noninteractive

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
src=${THERMITE_SRC:-$repo}
cache=${THERMITE_VM_CACHE:-/var/cache/thermite-vm}
modes=${THERMITE_VM_MODES:-false true}
packages=${THERMITE_VM_PACKAGES:-./internal/seccomp}
smp=${THERMITE_VM_SMP:-2}
boot_timeout=${THERMITE_VM_TIMEOUT:-900}
reason="this kernel does not run i386 system calls from a 64-bit process (int 0x80 faults): nothing for the filter to stop"

skip() { echo "vm: SKIP: $*"; exit 77; }
fail() { echo "vm: FAIL: $*"; exit 1; }
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

t_all=$(now)
[ "$(uname -m)" = x86_64 ] || skip "needs an x86_64 host (this is $(uname -m))"
[ "$(id -u)" = 0 ] || skip "needs root: it installs qemu and the kernel package with apt-get"
command -v go >/dev/null || skip "needs Go on PATH to build the test binaries"

mkdir -p "$cache/kernel" "$cache/tmp"

# The tools, installed on a fresh Debian machine.
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v cpio >/dev/null || need+=(cpio)
command -v timeout >/dev/null || need+=(coreutils)
if [ ${#need[@]} -gt 0 ]; then
	command -v apt-get >/dev/null || skip "needs ${need[*]} and has no apt-get to install them"
	t=$(now)
	{ apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >"$cache/apt.log" 2>&1 ||
		skip "could not install ${need[*]} (see $cache/apt.log)"
	echo "vm: installed ${need[*]} in $(since "$t") s"
fi
# The kernel: the newest Debian 6.12 image, kept in the cache. bookworm has
# it in bookworm-security; a machine whose sources lack that suite gets it
# from a private sources list that leaves the system's apt state alone.
kernel_pkg() {
	apt-cache "$@" search --names-only '^linux-image-6\.12\.[0-9.]+\+deb[0-9]+-amd64-unsigned$' 2>/dev/null |
		awk '{ print $1 }' | sort -V | tail -n 1
}
if [ ! -s "$cache/kernel/current" ]; then
	command -v apt-get >/dev/null || skip "needs apt-get to download Debian's 6.12 kernel"
	t=$(now)
	apt-get update -qq >/dev/null 2>&1 || true
	aptopts=()
	pkg=$(kernel_pkg)
	if [ -z "$pkg" ]; then
		mkdir -p "$cache/apt/lists/partial" "$cache/apt/sources.list.d"
		# The security archive sits beside the main archive the machine
		# already uses: its URI with /debian-security for /debian.
		# grep exits 2 for a sources file this machine lacks (pipefail).
		base=$(grep -shoE '^(URIs:|deb) +[a-z]+://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
			awk '{ print $2 }' | head -n 1 || true)
		[ -n "$base" ] || skip "no Debian archive in the machine's apt sources to find bookworm-security beside"
		echo "deb ${base%/}-security bookworm-security main" >"$cache/apt/sources.list"
		aptopts=(-o "Dir::Etc::SourceList=$cache/apt/sources.list" -o "Dir::Etc::SourceParts=$cache/apt/sources.list.d"
			-o "Dir::State::Lists=$cache/apt/lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
		apt-get "${aptopts[@]}" update -qq >/dev/null 2>&1 || skip "cannot reach bookworm-security for the 6.12 kernel"
		pkg=$(kernel_pkg "${aptopts[@]}")
	fi
	[ -n "$pkg" ] || skip "no linux-image-6.12.*-amd64-unsigned package in reach"
	dl=$(mktemp -d "$cache/tmp/dl.XXXXXX")
	(cd "$dl" && apt-get "${aptopts[@]}" download -qq "$pkg" >/dev/null 2>&1) || skip "could not download $pkg"
	echo "vm: downloaded $pkg ($(du -h "$dl"/*.deb | cut -f1)) in $(since "$t") s"
	dpkg-deb --fsys-tarfile "$dl"/*.deb | tar -x -C "$dl" --wildcards './boot/vmlinuz-*' './boot/config-*'
	release=$(basename "$dl"/boot/vmlinuz-*)
	release=${release#vmlinuz-}
	mv "$dl/boot/vmlinuz-$release" "$dl/boot/config-$release" "$cache/kernel/"
	rm -rf "$dl"
	echo "$release" >"$cache/kernel/current"
fi
release=$(cat "$cache/kernel/current")
kernel=$cache/kernel/vmlinuz-$release
grep -q '^CONFIG_IA32_EMULATION=y' "$cache/kernel/config-$release" ||
	skip "kernel $release has no IA32 emulation, so it cannot show both modes"

# A static busybox gives the tests /bin/sh and /bin/true; it is extracted
# into the cache, not installed, so the host's packages stay as they are.
if [ ! -x "$cache/busybox" ]; then
	dl=$(mktemp -d "$cache/tmp/dl.XXXXXX")
	if (cd "$dl" && apt-get download -qq busybox-static >/dev/null 2>&1); then
		dpkg-deb --fsys-tarfile "$dl"/*.deb | tar -x -C "$dl" ./bin/busybox
		mv "$dl/bin/busybox" "$cache/busybox"
	else
		echo "vm: no busybox-static package: the VM has no /bin/sh, and tests that need one skip"
	fi
	rm -rf "$dl"
fi

if [ "${THERMITE_VM_PREPARE:-}" = 1 ]; then
	echo "vm: prepared in $(since "$t_all") s: kernel $release and busybox are in $cache"
	exit 0
fi

# The initramfs: a static /init and the packages' test binaries.
work=$(mktemp -d "$cache/tmp/run.XXXXXX")
trap 'rm -rf "$work"' EXIT
t=$(now)
root=$work/root
mkdir -p "$root/tests" "$root/proc" "$root/sys" "$root/dev" "$root/tmp" "$root/root" "$root/etc"
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -o "$root/init" ./e2e/vm/init)
(
	cd "$src"
	for p in $packages; do
		CGO_ENABLED=0 go test -c -trimpath -o "$root/tests/$(basename "$p").test" "$p"
	done
)
if [ -x "$cache/busybox" ]; then
	mkdir -p "$root/bin"
	cp "$cache/busybox" "$root/bin/busybox"
	for applet in sh true false cat ls id; do ln -s busybox "$root/bin/$applet"; done
fi
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet) >"$work/initramfs.cpio"
echo "vm: built /init and $(ls "$root/tests" | tr '\n' ' ')in $(since "$t") s (initramfs $(du -h "$work/initramfs.cpio" | cut -f1))"

# One boot per mode; each must reach a verdict and show the i386 test's
# expected line.
status=0
for mode in $modes; do
	log=$work/boot-$mode.log
	# A machine under software emulation that printed no verdict (a kernel
	# that oopsed at boot, as 6.12 did once under TCG patching its own
	# text) is booted once more, said so; a second miss fails.
	for try in 1 2; do
		echo "vm: booting $release with ia32_emulation=$mode (try $try)"
		t=$(now)
		set +e
		timeout -k 10 "$boot_timeout" qemu-system-x86_64 -machine q35 -accel tcg -cpu max -smp "$smp" -m 2G \
			-nographic -no-reboot -nic none -kernel "$kernel" -initrd "$work/initramfs.cpio" \
			-append "console=ttyS0 ia32_emulation=$mode panic=-1 quiet loglevel=4 ${THERMITE_VM_RUN:+thermite.run=$THERMITE_VM_RUN}" </dev/null 2>&1 |
			while IFS= read -r line; do
				line=${line%$'\r'}
				case $line in
				*"THERMITE-VM: init started"*) echo "vm: [host] init reached $(since "$t") s after qemu started" ;;
				esac
				printf '%s\n' "$line"
			done | tee "$log"
		rc=${PIPESTATUS[0]}
		set -e
		echo "vm: boot with ia32_emulation=$mode took $(since "$t") s (qemu status $rc)"
		grep -aq 'THERMITE-VM: VERDICT' "$log" && break
		[ "$try" -eq 1 ] && echo "vm: ia32_emulation=$mode: try 1 printed no verdict (qemu status $rc); booting again"
	done
	verdict=$(grep -a 'THERMITE-VM: VERDICT' "$log" | tail -n 1 || true)
	if [ -z "$verdict" ]; then
		echo "vm: FAIL: ia32_emulation=$mode: no verdict (qemu status $rc)"
		status=1
		continue
	fi
	case $verdict in
	*"VERDICT PASS"*) ;;
	*)
		echo "vm: FAIL: ia32_emulation=$mode: $verdict"
		status=1
		;;
	esac
	case $mode in
	false | 0 | n | no | off)
		if grep -aq -- '--- SKIP: TestI386ABIKilled' "$log" && grep -aqF "$reason" "$log"; then
			echo "vm: ok: ia32_emulation=$mode: TestI386ABIKilled skipped with its reason"
		else
			echo "vm: FAIL: ia32_emulation=$mode: TestI386ABIKilled did not skip with \"$reason\""
			status=1
		fi
		;;
	*)
		if grep -aq -- '--- PASS: TestI386ABIKilled' "$log"; then
			echo "vm: ok: ia32_emulation=$mode: TestI386ABIKilled passed"
		else
			echo "vm: FAIL: ia32_emulation=$mode: TestI386ABIKilled did not pass"
			status=1
		fi
		;;
	esac
done
echo "vm: whole run $(since "$t_all") s"
if [ $status -ne 0 ]; then
	fail "see the lines above"
fi
echo "vm: PASS"
