#!/usr/bin/env bash
# Installs the agent programs the rig runs in lanes (Pi, Claude Code, Codex,
# OpenCode) at the pinned versions of agents/package.json into
# ${THERMITE_AGENTS:-/opt/thermite/agents}: root-owned, readable and runnable
# by every role, writable by none, with thermite's extension for Pi
# (agents/pi/thermite.ts). Node.js and npm come from Debian.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${THERMITE_AGENTS:-/opt/thermite/agents}
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
fi
install -d -o root -g root -m 0755 "$dest"
cp agents/package.json "$dest/package.json"
if [ -f agents/package-lock.json ]; then cp agents/package-lock.json "$dest/package-lock.json"; fi
# --ignore-scripts off: Codex and OpenCode pick their platform binary in
# optional dependencies; no postinstall downloads anything past the registry.
(cd "$dest" && npm install --no-audit --no-fund --loglevel=error)
cp "$dest/package-lock.json" agents/package-lock.json 2>/dev/null || true
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
