#!/usr/bin/env bash
# Installs Postgres with apt-get when its server binaries (initdb, postgres, pg_isready)
# are neither on the PATH nor in /usr/lib/postgresql/<version>/bin, where Debian's
# package puts them. The fencing tests start their own server (testkit::PgServer).
set -euo pipefail

if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  exit 0
fi
echo "not found: installing postgresql with apt-get" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
install() { DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null; }
# The package lists are fresh when ensure-redis.sh has just installed something: update
# them only when the install cannot find the package (apt-get update once per run).
install || { $SUDO apt-get update -qq && install; }
