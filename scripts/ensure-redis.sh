#!/usr/bin/env bash
# Installs redis-server (and redis-cli), redis-sentinel, openssl and tmux with apt-get when
# missing, then prints the server's version.
# Used by test.sh and bench.sh; servers themselves are started by the tests and the bench.
set -euo pipefail

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
updated=""
install() {
  echo "not found: installing $* with apt-get" >&2
  [ -n "$updated" ] || { $SUDO apt-get update -qq && updated=1; }
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

# openssl (the command) makes the certificates of the TLS tests.
missing=()
command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
if [ "${#missing[@]}" -gt 0 ]; then
  install "${missing[@]}"
fi
# tmux runs the command's terminal tests (`distlock watch`, `release`'s question, the
# screens the README shows). Where it cannot be installed, test.sh says so and runs them
# with DISTLOCK_SKIP_TMUX=1, which skips them (each says it was skipped).
if ! command -v tmux >/dev/null 2>&1; then
  install tmux || echo "tmux could not be installed with apt-get" >&2
fi
redis-server --version
