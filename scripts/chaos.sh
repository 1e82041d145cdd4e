#!/usr/bin/env bash
# The chaos run (tests/chaos.rs) for as long as wanted, in release mode:
#
#   scripts/chaos.sh [SECONDS] [SEED]
#
# SECONDS: the whole run (default 300; the CI run of `cargo test` uses 60).
# SEED: rerun a seed printed by an earlier run (`chaos seed = N`); default: a new one.
# A failing run prints the seed, the violations with the events of the calls involved,
# and keeps its event log. DISTLOCK_CHAOS_KEEP=1 keeps the logs of a passing run too.
# DISTLOCK_CHAOS_PLANT=renewal-ignores-token plants a bug in the children, which the run
# must then report (see tests/chaos.rs: "Checking the analysis against a planted bug").
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-redis.sh >/dev/null

export DISTLOCK_CHAOS_SECS="${1:-300}"
if [ -n "${2:-}" ]; then
  export DISTLOCK_CHAOS_SEED="$2"
else
  unset DISTLOCK_CHAOS_SEED
fi
exec cargo test --release --all-features --test chaos -- --nocapture
