# thermite's images: the harness (the default target) and the one-container
# rig image (--target one-container, for hosts such as RunPod that run a
# single container).
#
#   make                                            # bin/thermite and bin/thermite-run-as, static
#   podman build -t thermite .                      # or docker build
#   podman build --target one-container -t thermite:one-container .
#
# BASE names the base image. Any Debian bookworm image does; on a machine
# that reaches only Debian's mirrors, make one with debootstrap and import
# it (scripts/container-test.sh does exactly that):
#
#   debootstrap --variant=minbase bookworm DIR
#   tar -C DIR -c . | podman import - localhost/debian-base:bookworm
#   podman build --build-arg BASE=localhost/debian-base:bookworm .
#
# The judge's builds run inside this image, as the builder role, so the
# base must hold the toolchains the rig's kits build with: the example kit
# (examples/kits/sum) runs `cc`, which a base made with
# `debootstrap --variant=minbase --include=gcc,libc6-dev bookworm DIR` has.
#
# RIG_TOML is the rig's configuration, the text of a rig.toml: it becomes
# /etc/thermite/rig.toml, and the image's role users are made from it. Empty
# (the default): the embedded defaults. A GPU layout must be here, not only
# in a file mounted at run time: it adds users (run-2, … one per timing
# user) and groups (gpu, gpu-N) the broker checks for at every start.
#
#   podman build --build-arg RIG_TOML="$(cat rig.toml)" .
#
# The build needs no network: nothing here downloads anything.
ARG BASE=debian:bookworm-slim

# ---------------------------------------------------------------------------
# build: the binary.
#
# thermite is one static binary (CGO_ENABLED=0, no libc), so where it is
# compiled does not matter: it is compiled on the build host by `make`
# (Go 1.26 and the module cache are there) and taken from the build context
# as bin/thermite. A stage that compiled it here would need a Go toolchain
# inside the build, which means a golang image from a registry or a download
# during the build; neither is reachable on the rig's build machines, and
# it would give the same static binary. This stage checks what it was given:
# the binary must run on the bare base (no loader, no libraries) and answer
# with its role table.
#
# bin/thermite-run-as (also from `make`) is `thermite run-as` linking only
# the broker's protocol, for the operator: root's alone, mode 0700.
FROM ${BASE} AS build
COPY bin/thermite /out/thermite
COPY bin/thermite-run-as /out/thermite-run-as
RUN chown 0:0 /out/thermite /out/thermite-run-as \
 && chmod 0711 /out/thermite \
 && chmod 0700 /out/thermite-run-as \
 && /out/thermite roles >/dev/null \
 && /out/thermite-run-as --help >/dev/null

# ---------------------------------------------------------------------------
# rig: what both images are. The harness target (the last stage, so the
# default) is exactly this; one-container adds the supervisor's place.
FROM ${BASE} AS rig
ARG RIG_TOML=""

# Root-owned, mode 0711: roles can execute the shim but not read it, and the
# shim starts non-dumpable.
COPY --from=build /out/thermite /usr/local/bin/thermite
COPY --from=build /out/thermite-run-as /usr/local/bin/thermite-run-as

# The rig's configuration, when RIG_TOML gives one: root 0644 at
# /etc/thermite/rig.toml, which thermite reads when it is there. It is
# checked here (`thermite config` refuses an unknown key or a bad value), so
# a wrong one fails the build, not the first start. The image's folders
# below are the defaults' (state_dir, the exchange folders): a RIG_TOML
# keeps those keys as they are.
#
# The role users and groups, written at build time from that configuration:
# `thermite roles` in this image is the image's user reference, and the
# broker finds them there at every start (it checks the users in
# /etc/passwd; its start-up self-test, each role's groups in /etc/group).
#
# The exchange folders with the supervisor (see compose.yaml): the inbox
# the supervisor fills and only the controller's group reads, the outbox
# the controller fills and only the supervisor's group reads. They are
# set-group-id folders so that what each side writes gets the other side's
# group without chgrp (which neither may do): a set-group-id folder gives no
# process any privilege, unlike a set-group-id program. They seed the named
# volumes compose mounts on them.
#
# The state folder is made root 0755 so that a fresh volume mounted on it
# starts root's; the broker makes its folders under it at every start.
#
# Last, no file of the image keeps a set-user-id or set-group-id bit: a
# host that lets processes gain privileges (RunPod does) finds no program
# to gain them through. The check after the sweep fails the build if one is
# left.
RUN set -eu; \
    install -d -o root -g root -m 0755 /etc/thermite; \
    if [ -n "$RIG_TOML" ]; then \
        printf '%s\n' "$RIG_TOML" >/etc/thermite/rig.toml; \
        chmod 0644 /etc/thermite/rig.toml; \
        /usr/local/bin/thermite config >/dev/null; \
    fi; \
    /usr/local/bin/thermite roles ensure; \
    install -d -o root -g root -m 0755 /var/lib/thermite; \
    install -d -o supervisor -g thermite -m 2750 /var/lib/thermite-inbox; \
    install -d -o thermite -g supervisor -m 2750 /var/lib/thermite-outbox; \
    find / -xdev -perm /6000 -type f -exec chmod ug-s {} +; \
    left="$(find / -xdev -perm /6000 -type f)"; \
    if [ -n "$left" ]; then echo "set-id files left: $left" >&2; exit 1; fi

# The broker is PID 1: it re-execs itself with the reduced bounding set and
# no_new_privs, reaps every orphan, and on SIGTERM stops the controller and
# every role's processes and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/thermite"]
CMD ["serve"]

# ---------------------------------------------------------------------------
# one-container: the harness with the supervisor inside it, one more user
# beside the roles (uid base+300, `supervisor` in the role table).
#
# The supervisor's place: its own folder, closed to everyone else (its
# token, its keys, the advisors' sign-ins). Its inbox and outbox are the
# harness's exchange folders above, on the container's own disk.
#
# Its token file is there from the start, empty, the supervisor's 0600:
# enrollment writes the token into it, and the self-test's row "read the
# supervisor's token" tries it as every other role from the first start.
#
# The rig's configuration gets the [image] table that turns on the
# self-test's rows for this image: no set-id file, the supervisor's folder
# and token closed to every role, the inbox and outbox closed to all but
# their two sides (RIG_TOML, if given, must not have an [image] table: the
# check below fails the build on a second one).
#
# The entry point stays `thermite serve`; the binary does the rest:
# RunPod's variables (strip_env_prefixes, RUNPOD_ by default) are removed
# from the broker's environment before anything starts, and control's key
# is checked against the SHA-256 the launch names and installed root's:
#
#   thermite serve --control-key FILE --control-key-sha256 HEX
FROM rig AS one-container
RUN set -eu; \
    install -d -o supervisor -g supervisor -m 0700 /var/lib/thermite-supervisor; \
    install -o supervisor -g supervisor -m 0600 /dev/null /var/lib/thermite-supervisor/token; \
    printf '%s\n' '' \
        '# The one-container image (Dockerfile, target one-container).' \
        '[image]' \
        'one_container = true' \
        'supervisor_dir = "/var/lib/thermite-supervisor"' \
        'inbox = "/var/lib/thermite-inbox"' \
        'outbox = "/var/lib/thermite-outbox"' \
        'scan_root = "/"' >>/etc/thermite/rig.toml; \
    chmod 0644 /etc/thermite/rig.toml; \
    /usr/local/bin/thermite config | grep -Eq '^[[:space:]]*one_container = true$'; \
    find / -xdev -perm /6000 -type f -exec chmod ug-s {} +; \
    left="$(find / -xdev -perm /6000 -type f)"; \
    if [ -n "$left" ]; then echo "set-id files left: $left" >&2; exit 1; fi

# ---------------------------------------------------------------------------
# harness (the default target): the broker's container. compose.yaml gives
# it exactly CHOWN, DAC_OVERRIDE, FOWNER, SETUID, SETGID, KILL and
# CHECKPOINT_RESTORE (the disk measure's) with no-new-privileges; `thermite serve` drops to that set itself and proves it
# is enough. It is the last stage so that a plain `build .` makes it.
FROM rig AS harness
