#!/usr/bin/env bash
# Install and configure Nix for offline use (the Nix-environment tests): Debian's nix-bin, no build
# users, no substituters, no sandbox, flakes on, and an empty local flake registry. Idempotent: a
# second run changes nothing. Needs root (apt-get); prints why and exits 0 if it cannot.
set -euo pipefail
if ! command -v nix >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup-nix: not root or no apt-get; Nix tests will be skipped" >&2
    exit 0
  fi
  apt-get install -y -qq --no-install-recommends nix-bin >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends nix-bin >/dev/null; }
fi
mkdir -p /etc/nix
[ -f /etc/nix/empty-registry.json ] || echo '{"flakes":[],"version":2}' > /etc/nix/empty-registry.json
want='build-users-group =
substituters =
sandbox = false
experimental-features = nix-command flakes
flake-registry = /etc/nix/empty-registry.json'
if [ "$(cat /etc/nix/nix.conf 2>/dev/null)" != "$want" ]; then
  printf '%s\n' "$want" > /etc/nix/nix.conf
fi
nix --version >/dev/null
