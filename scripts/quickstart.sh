#!/usr/bin/env bash
# Runs the quickstart example: against $REDIS_URL when set; else against a private
# redis-server when one is installed; else on the in-memory backend (it says so).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${REDIS_URL:-}" ] && command -v redis-server >/dev/null 2>&1; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 16379)
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
  server=$!
  trap 'kill $server 2>/dev/null || true' EXIT
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  export REDIS_URL="redis://127.0.0.1:$port/"
fi
cargo run --quiet --example quickstart
