#!/usr/bin/env bash
# What each uncontended command costs redis-server itself, in µs of its CPU per call
# (INFO commandstats, Lua's inner calls included): the baseline's SET NX PX and
# compare-and-delete against distlock's uncontended acquire (a plain SET NX PX GET) and
# release (unlock.lua: a compare-and-delete that also tells a value a waiter marked). Starts a private
# redis-server on a free port; 100,000 calls per command on distinct keys, sent with
# redis-cli --pipe. ROUNDS=n repeats (default 3). Diagnostic only: never fails on a figure.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-redis.sh

N=100000
ROUNDS=${ROUNDS:-3}
port=""
for p in $(seq 21000 21200); do
  if ! (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null; then port=$p; break; fi
done
[ -n "$port" ] || { echo "no free port" >&2; exit 1; }
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  >/dev/null 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; rm -rf "$dir"' EXIT
cli() { redis-cli -p "$port" "$@"; }
until cli ping >/dev/null 2>&1; do sleep 0.05; done

cad="if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"
release=$(cli script load "$(cat lockcore/src/scripts/unlock.lua)")
compare_delete=$(cli script load "$cad")

# RESP for N commands; $1 picks the command, %d in the arguments is the key number.
commands() {
  awk -v n="$N" -v kind="$1" -v rel="$release" -v cad="$compare_delete" '
    function cmd(argc, args,   i, out) {
      out = "*" argc "\r\n"
      for (i = 1; i <= argc; i++) out = out "$" length(args[i]) "\r\n" args[i] "\r\n"
      printf "%s", out
    }
    BEGIN {
      for (i = 0; i < n; i++) {
        k = "k:" i
        split("", a)
        if (kind == "set") { a[1]="SET"; a[2]=k; a[3]="tok"; a[4]="NX"; a[5]="PX"; a[6]="30000"; cmd(6, a) }
        else if (kind == "acquire") { a[1]="SET"; a[2]=k; a[3]="tok"; a[4]="NX"; a[5]="PX"; a[6]="30000"; a[7]="GET"; cmd(7, a) }
        else if (kind == "cad") { a[1]="EVALSHA"; a[2]=cad; a[3]="1"; a[4]=k; a[5]="tok"; cmd(5, a) }
        else { a[1]="EVALSHA"; a[2]=rel; a[3]="1"; a[4]=k; a[5]="tok"; cmd(5, a) }
      }
    }'
}

# µs per call of the top-level command ($2) while sending $1.
cost() {
  cli config resetstat >/dev/null
  commands "$1" | cli --pipe >/dev/null
  cli info commandstats | tr -d '\r' | awk -F'[=,]' -v c="cmdstat_$2:calls" '$1 == c { print $6 }'
}

printf '%-7s %12s %12s %14s %12s %14s %14s\n' round "SET NX PX" "cmp-and-del" "SET NX PX GET" "unlock.lua" "baseline pair" "distlock pair"
for r in $(seq 1 "$ROUNDS"); do
  cli flushall >/dev/null; set_us=$(cost set set); cad_us=$(cost cad evalsha)
  cli flushall >/dev/null; acq_us=$(cost acquire set); rel_us=$(cost release evalsha)
  awk -v r="$r" -v s="$set_us" -v c="$cad_us" -v a="$acq_us" -v l="$rel_us" 'BEGIN {
    printf "%-7s %12.2f %12.2f %14.2f %12.2f %14.2f %14.2f\n", r, s, c, a, l, s + c, a + l }'
done
