#!/usr/bin/env bash
# The whole test suite. Installs redis-server when missing; every test starts its own
# private redis-server on a free port (nothing assumes a server on 6379).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server not found: installing it with apt-get" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
redis-server --version

# Library, macro, integration, multi-process, fault, UI (trybuild) and doc tests, with the
# axum and actix integrations on (their tests and the examples need them).
cargo test --workspace --all-features "$@"
