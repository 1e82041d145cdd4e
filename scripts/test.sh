#!/usr/bin/env bash
# The whole test suite. Installs redis-server when missing; every test starts its own
# private redis-server on a free port (nothing assumes a server on 6379).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-redis.sh

# Library, macro, integration, multi-process, fault, TLS, UI (trybuild) and doc tests, with
# every feature on (the framework integrations and `tls`: their tests and the examples need them).
cargo test --workspace --all-features "$@"
