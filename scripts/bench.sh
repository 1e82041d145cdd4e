#!/usr/bin/env bash
# Benchmarks distlock against a raw redis-rs baseline in the same run (benches/locks/).
# Installs redis-server when missing; the bench starts its own private redis-server on a
# free port. DISTLOCK_BENCH_QUICK=1 divides every count by 10; DISTLOCK_BENCH_ONLY=w5 runs
# only the HTTP idempotency workload, DISTLOCK_BENCH_ONLY=tls W1 plain and over TLS. Never
# fails on a target.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-redis.sh

cargo bench --bench locks --features tls "$@"
