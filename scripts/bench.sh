#!/usr/bin/env bash
# Benchmarks distlock against a raw redis-rs baseline in the same run (benches/locks.rs).
# Installs redis-server when missing; the bench starts its own private redis-server on a
# free port. DISTLOCK_BENCH_QUICK=1 divides every count by 10. Never fails on a target.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "redis-server not found: installing it with apt-get" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
redis-server --version

cargo bench --bench locks "$@"
