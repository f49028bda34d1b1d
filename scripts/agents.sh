#!/usr/bin/env bash
# Installs the agent programs the rig runs in lanes (Pi, Claude Code, Codex,
# OpenCode) at the versions agents/package-lock.json pins, with `npm ci` (the
# lock enforced, nothing resolved anew), into
# ${THERMITE_AGENTS:-/opt/thermite/agents}: root-owned, readable and runnable
# by every role, writable by none, with thermite's extension for Pi
# (agents/pi/thermite.ts). Node.js and npm come from Debian. The checkout is
# only read: the lock is changed by hand (docs/agents.md, adding a program).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${THERMITE_AGENTS:-/opt/thermite/agents}

# The oldest Node.js the lock's programs run on: undici (Pi's HTTP client)
# declares >=20.18.1, the highest a program needs at run time. Claude Code's
# package declares >=22.0.0, but only its installer (install.cjs, which
# copies its native binary into place) runs on Node.js, measured to work on
# 20.20.2. docs/agents_test.go checks this against every package of the lock.
node_min=20.18.1

if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
fi
have=$(node --version)
have=${have#v}
if [ "$(printf '%s\n%s\n' "$node_min" "$have" | sort -V | head -1)" != "$node_min" ]; then
	echo "agents.sh: Node.js $have is older than $node_min, which agents/package-lock.json needs (undici, Pi's HTTP client); install a newer nodejs" >&2
	exit 1
fi
if [ ! -f agents/package-lock.json ]; then
	echo "agents.sh: agents/package-lock.json is missing: npm ci installs only what a lock pins (make one with npm install --package-lock-only in agents/)" >&2
	exit 1
fi

install -d -o root -g root -m 0755 "$dest"
# npm ci empties node_modules before it installs, which would pull the
# programs from under an agent test running now: a tree already installed
# from this very lock is kept.
if cmp -s agents/package-lock.json "$dest/package-lock.json" && [ -f "$dest/node_modules/.package-lock.json" ]; then
	echo "agents.sh: $dest already holds agents/package-lock.json's programs"
else
	install -o root -g root -m 0644 agents/package.json "$dest/package.json"
	install -o root -g root -m 0644 agents/package-lock.json "$dest/package-lock.json"
	# Scripts stay on: Codex and OpenCode pick their platform binary in
	# optional dependencies and Claude Code's postinstall copies its own into
	# place; none downloads anything past the registry.
	(cd "$dest" && npm ci --no-audit --no-fund --loglevel=error)
fi
# thermite's extension for Pi: agent-N's Pi loads it from here (config
# [agent] pi_extension), and thermite refuses a Pi run unless it is root's
# and written by no one else. Pi's own local shell is no-local-shell, which
# runs nothing.
install -d -o root -g root -m 0755 "$dest/pi-extension"
install -o root -g root -m 0644 agents/pi/thermite.ts "$dest/pi-extension/thermite.ts"
install -o root -g root -m 0755 agents/pi/no-local-shell "$dest/pi-extension/no-local-shell"
chmod -R go-w,a+rX "$dest"
for b in pi claude codex opencode; do
	printf '%-9s %s\n' "$b" "$("$dest/node_modules/.bin/$b" --version 2>&1 | head -1)"
done
