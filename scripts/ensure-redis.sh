#!/usr/bin/env bash
# Installs redis-server (and redis-cli), redis-sentinel, openssl and tmux with apt-get when
# missing, then prints the server's version.
# Used by test.sh and bench.sh; servers themselves are started by the tests and the bench.
set -euo pipefail

# openssl (the command) makes the certificates of the TLS tests.
missing=""
command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || missing="redis-server"
command -v redis-sentinel >/dev/null 2>&1 || missing="$missing redis-sentinel"
command -v openssl >/dev/null 2>&1 || missing="$missing openssl"
# tmux runs `distlock watch` in a real terminal (the command's tests).
command -v tmux >/dev/null 2>&1 || missing="$missing tmux"
if [ -n "$missing" ]; then
  echo "not found: installing $missing with apt-get" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
redis-server --version
