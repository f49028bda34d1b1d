# thermite's images: the harness (the default target) and the one-container
# rig image (--target one-container, for hosts such as RunPod that run a
# single container).
#
#   make                                            # bin/thermite, static
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
FROM ${BASE} AS build
COPY bin/thermite /out/thermite
RUN chown 0:0 /out/thermite \
 && chmod 0711 /out/thermite \
 && /out/thermite roles >/dev/null

# ---------------------------------------------------------------------------
# rig: what both images are. The harness target (the last stage, so the
# default) is exactly this; one-container adds the supervisor's place.
FROM ${BASE} AS rig

# Root-owned, mode 0711: roles can execute the shim but not read it, and the
# shim starts non-dumpable.
COPY --from=build /out/thermite /usr/local/bin/thermite

# The role users and groups, written at build time: `thermite roles` in this
# image is the image's user reference, and the broker, which checks them in
# /etc/passwd at every start, finds them there.
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
    /usr/local/bin/thermite roles ensure; \
    install -d -o root -g root -m 0755 /var/lib/thermite; \
    install -d -o root -g root -m 0755 /etc/thermite; \
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
# The entry point stays `thermite serve`. What this target still needs from
# the binary (not from this file): removing RunPod's variables (RUNPOD_*)
# from the environment before anything starts, taking control's key that
# root checked against the launch's SHA-256 (`--control-key`), starting the
# supervisor as its user with no_new_privs and a GPU fence with no card, and
# the self-test rows for all four and for the supervisor's user.
FROM rig AS one-container
RUN set -eu; \
    install -d -o supervisor -g supervisor -m 0700 /var/lib/thermite-supervisor; \
    find / -xdev -perm /6000 -type f -exec chmod ug-s {} +; \
    left="$(find / -xdev -perm /6000 -type f)"; \
    if [ -n "$left" ]; then echo "set-id files left: $left" >&2; exit 1; fi

# ---------------------------------------------------------------------------
# harness (the default target): the broker's container. compose.yaml gives
# it exactly CHOWN, DAC_OVERRIDE, FOWNER, SETUID, SETGID and KILL with
# no-new-privileges; `thermite serve` drops to that set itself and proves it
# is enough. It is the last stage so that a plain `build .` makes it.
FROM rig AS harness
