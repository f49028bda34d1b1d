#!/usr/bin/env bash
# e2e/vm/kernels.sh boots the rig under qemu (software emulation, no KVM
# needed) on the kernels and cgroup setups rigs meet, each with a Debian
# bookworm minbase root file system packed as the initramfs, the thermite
# binary and e2e/vm/riginit as /init. Each machine starts the broker with the
# default configuration, then with the losses its setup needs accepted, and
# runs the self-test, a command as a lane, a memory bomb, a fork bomb, the
# lane's stop and a trial (6.12-rw then starts the rig once more with its
# state dir on an ext4 with user quotas: the quota path); it prints one "THERMITE-VM: RESULT {json}" line,
# which e2e/vm/kernels_test.go reads and asserts on per setup.
#
# Setups (THERMITE_VM_SETUPS picks some by name):
#   6.12-rw  Debian's 6.12 (Landlock ABI 6), cgroup2 mounted read-write
#   6.12-ro  Debian's 6.12, cgroup2 mounted read-only (a container's view)
#   6.1      Debian 12's 6.1 (Landlock ABI 2), cgroup2 read-write
#
# Exit status: 0 every setup gave a result, 1 one did not, 77 this machine
# cannot run the check (no root, no qemu, no kernel, no debootstrap).
#
# Environment:
#   THERMITE_VM_CACHE     kernels, the root file system, work files (/var/cache/thermite-vm)
#   THERMITE_VM_SETUPS    setups to boot ("6.12-rw 6.12-ro 6.1")
#   THERMITE_VM_SMP       virtual CPUs (2)
#   THERMITE_VM_TIMEOUT   seconds one boot may take (600)
#   THERMITE_VM_MIRROR    the Debian mirror for debootstrap (the machine's own)
#   THERMITE_VM_STOPBENCH 1: 6.12-rw also times the stop of 50 sleepers with
#                         and without the role's cgroup (figures, not
#                         checks; off in CI, where it took minutes)
#   THERMITE_VM_PREPARE   1: fetch the kernels and make the root, boot nothing
#                         (CI runs this beside its other set-up)
set -euo pipefail
export PATH=/usr/local/go/bin:$PATH
export DEBIAN_FRONTEND=noninteractive

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${THERMITE_VM_CACHE:-/var/cache/thermite-vm}
setups=${THERMITE_VM_SETUPS:-6.12-rw 6.12-ro 6.1}
smp=${THERMITE_VM_SMP:-2}
boot_timeout=${THERMITE_VM_TIMEOUT:-600}

skip() { echo "vm: SKIP: $*"; exit 77; }
fail() { echo "vm: FAIL: $*"; exit 1; }
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

t_all=$(now)
[ "$(uname -m)" = x86_64 ] || skip "needs an x86_64 host (this is $(uname -m))"
[ "$(id -u)" = 0 ] || skip "needs root: it installs qemu, downloads kernels and runs debootstrap"
command -v go >/dev/null || skip "needs Go on PATH to build thermite"
mkdir -p "$cache/tmp"

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v cpio >/dev/null || need+=(cpio)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v xz >/dev/null || need+=(xz-utils)
command -v zstd >/dev/null || need+=(zstd)
if [ ${#need[@]} -gt 0 ]; then
	command -v apt-get >/dev/null || skip "needs ${need[*]} and has no apt-get to install them"
	{ apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >"$cache/apt.log" 2>&1 ||
		skip "could not install ${need[*]} (see $cache/apt.log)"
fi

# The kernels. 6.12 is the one e2e/vm/run.sh fetches (bookworm-security);
# 6.1 is bookworm's own linux-image-6.1.0-N-amd64, from the machine's apt
# sources. Each is kept in the cache: DIR/current names the release.
if [ ! -s "$cache/kernel/current" ]; then
	# run.sh downloads it on its way; booting nothing.
	THERMITE_VM_PREPARE=1 "$here/run.sh" >/dev/null 2>&1 || true
fi
[ -s "$cache/kernel/current" ] || skip "no Debian 6.12 kernel in $cache/kernel (e2e/vm/run.sh fetches it)"
if [ ! -s "$cache/kernel61/current" ]; then
	apt-get update -qq >/dev/null 2>&1 || true
	pkg=$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' 2>/dev/null | awk '{ print $1 }' | sort -V | tail -n 1)
	[ -n "$pkg" ] || skip "no linux-image-6.1.0-*-amd64 package in the machine's apt sources"
	dl=$(mktemp -d "$cache/tmp/dl.XXXXXX")
	(cd "$dl" && apt-get download -qq "$pkg" >/dev/null 2>&1) || skip "could not download $pkg"
	dpkg-deb --fsys-tarfile "$dl"/*.deb | tar -x -C "$dl" --wildcards './boot/vmlinuz-*' './boot/config-*'
	release=$(basename "$dl"/boot/vmlinuz-*)
	release=${release#vmlinuz-}
	mkdir -p "$cache/kernel61"
	mv "$dl/boot/vmlinuz-$release" "$dl/boot/config-$release" "$cache/kernel61/"
	rm -rf "$dl"
	echo "$release" >"$cache/kernel61/current"
	echo "vm: downloaded $pkg"
fi

# The quota case (6.12-rw) mounts an ext4 with user quotas as the rig's
# state dir: Debian builds ext4, loop and the quota format as modules, so
# they come from the kernel's package, decompressed, kept beside it.
release612=$(cat "$cache/kernel/current")
mods=$cache/kernel/modules-$release612
quota_mods="kernel/lib/crc16 kernel/fs/mbcache kernel/fs/jbd2/jbd2 kernel/crypto/crc32c_generic kernel/fs/ext4/ext4 kernel/drivers/block/loop kernel/fs/quota/quota_tree kernel/fs/quota/quota_v2"
if [ ! -s "$mods/quota_v2.ko" ]; then
	dl=$(mktemp -d "$cache/tmp/dl.XXXXXX")
	aptopts=()
	[ -s "$cache/apt/sources.list" ] && aptopts=(-o "Dir::Etc::SourceList=$cache/apt/sources.list" -o "Dir::Etc::SourceParts=$cache/apt/sources.list.d"
		-o "Dir::State::Lists=$cache/apt/lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
	(cd "$dl" && { apt-get download -qq "linux-image-$release612-unsigned" || apt-get "${aptopts[@]}" download -qq "linux-image-$release612-unsigned"; } >/dev/null 2>&1) ||
		skip "could not download linux-image-$release612-unsigned for the quota case's modules"
	globs=()
	for m in $quota_mods; do globs+=("./lib/modules/$release612/$m.ko*"); done
	dpkg-deb --fsys-tarfile "$dl"/*.deb | tar -x -C "$dl" --wildcards "${globs[@]}"
	mkdir -p "$mods.part"
	for f in $(find "$dl/lib/modules" -name '*.ko*'); do
		case $f in
		*.xz) xz -dc "$f" >"$mods.part/$(basename "${f%.xz}")" ;;
		*.zst) zstd -qdc "$f" >"$mods.part/$(basename "${f%.zst}")" ;;
		*) cp "$f" "$mods.part/" ;;
		esac
	done
	rm -rf "$dl" "$mods" && mv "$mods.part" "$mods"
	echo "vm: kept the quota case's modules in $mods"
fi

# The root file system: debootstrap's minbase of bookworm, trimmed, kept as
# a tar in the cache (about 50 s once).
rootfs_tar=$cache/rootfs-bookworm-minbase.tar
if [ ! -s "$rootfs_tar" ]; then
	# grep exits 2 for a sources file this machine lacks (pipefail).
	mirror=${THERMITE_VM_MIRROR:-$(grep -shoE '^(URIs:|deb) +[a-z]+://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{ print $2 }' | head -n 1 || true)}
	[ -n "$mirror" ] || skip "no Debian archive in the machine's apt sources for debootstrap"
	t=$(now)
	rfs=$(mktemp -d "$cache/tmp/rootfs.XXXXXX")
	debootstrap --variant=minbase bookworm "$rfs" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
		skip "debootstrap failed (see $cache/debootstrap.log)"
	rm -rf "$rfs"/var/cache/apt/archives/*.deb "$rfs"/var/lib/apt/lists/* "$rfs"/usr/share/man/* \
		"$rfs"/usr/share/info/* "$rfs"/usr/share/locale/* "$rfs"/usr/share/doc/*
	tar -C "$rfs" -cf "$rootfs_tar.part" . && mv "$rootfs_tar.part" "$rootfs_tar"
	rm -rf "$rfs"
	echo "vm: made the root file system with debootstrap in $(since "$t") s"
fi

if [ "${THERMITE_VM_PREPARE:-}" = 1 ]; then
	echo "vm: prepared in $(since "$t_all") s: the kernels, the quota case's modules and the root are in $cache"
	exit 0
fi

# The initramfs: the root, thermite, /init and the example project.
work=$(mktemp -d "$cache/tmp/kernels.XXXXXX")
trap 'rm -rf "$work"' EXIT
t=$(now)
root=$work/root
mkdir -p "$root"
tar -C "$root" -xf "$rootfs_tar"
mkdir -p "$root/usr/local/bin" "$root/opt/thermite/examples/projects"
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -o "$root/usr/local/bin/thermite" ./cmd/thermite)
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -o "$work/init" ./e2e/vm/riginit)
rm -f "$root/init" && cp "$work/init" "$root/init"
cp -r "$repo/examples/projects/sum" "$root/opt/thermite/examples/projects/"
mkdir -p "$root/opt/thermite/modules" && cp "$mods"/*.ko "$root/opt/thermite/modules/"
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet) >"$work/initramfs.cpio"
rm -rf "$root"
echo "vm: packed the root, thermite and /init in $(since "$t") s (initramfs $(du -h "$work/initramfs.cpio" | cut -f1))"

status=0
for setup in $setups; do
	case $setup in
	6.12-rw) kdir=kernel cg=rw accept="" extra="thermite.quota=1${THERMITE_VM_STOPBENCH:+ thermite.stopbench=$THERMITE_VM_STOPBENCH}" ;;
	6.12-ro) kdir=kernel cg=ro accept="cgroup-limits" extra="" ;;
	6.1) kdir=kernel61 cg=rw accept="landlock-scope" extra="" ;;
	*) fail "unknown setup $setup" ;;
	esac
	release=$(cat "$cache/$kdir/current")
	log=$work/boot-$setup.log
	# A machine under software emulation that printed no result at all
	# (a hung boot, a console line torn) is booted once more, said so;
	# a second try without a result fails with the end of both logs.
	for try in 1 2; do
		echo "vm: booting $release with cgroup2 $cg (setup $setup, try $try)"
		t=$(now)
		set +e
		timeout -k 10 "$boot_timeout" qemu-system-x86_64 -machine q35 -accel tcg -cpu max -smp "$smp" -m 2G \
			-nographic -no-reboot -nic none -kernel "$cache/$kdir/vmlinuz-$release" -initrd "$work/initramfs.cpio" \
			-append "console=ttyS0 panic=-1 quiet loglevel=3 thermite.cgroup=$cg ${accept:+thermite.accept=$accept} $extra" </dev/null 2>&1 |
			while IFS= read -r line; do
				printf 'vm: [%s] %s\n' "$setup" "${line%$'\r'}"
			done | tee "$log.$try"
		rc=${PIPESTATUS[0]}
		set -e
		echo "vm: [$setup] boot and scenario took $(since "$t") s (qemu status $rc)"
		cp "$log.$try" "$log"
		grep -aq 'THERMITE-VM: RESULT' "$log" && break
		echo "vm: [$setup] try $try printed no result (qemu status $rc); its last lines:"
		tail -n 40 "$log.$try"
		if [ "$try" -eq 2 ]; then
			echo "vm: FAIL: $setup: no result in two boots"
			status=1
		fi
	done
done
echo "vm: whole run $(since "$t_all") s"
[ $status -eq 0 ] || fail "see the lines above"
echo "vm: PASS"
