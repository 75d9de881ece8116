#!/usr/bin/env bash
# Run every benchmark of bench/ one after the other and keep their output in bench/results/.
#
#   bash bench/run_all.sh            # quick profiles: about 7 minutes on 2 cores
#   bash bench/run_all.sh --long     # long profiles (opt-in): well over an hour
#
# Benchmarks print figures and assert nothing; a failing one is reported and the others
# still run. Redis: the benchmarks that need it use 127.0.0.1:6379 (db 10 for fast_path, fast_path_flat and
# incremental, 11 for the soak, 12 for turn_latency, 13 for throughput, 14 for proxy, 15 for http_load); when
# nothing answers
# there and a redis-server binary is on PATH, one is started for the run and stopped after.
# Bench-only dependencies (not in pyproject): pip install matplotlib langchain
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-bench/results}
LONG=0
[[ "${1:-}" == "--long" ]] && LONG=1
mkdir -p "$OUT"

STARTED_REDIS=""
if ! redis-cli -p 6379 ping >/dev/null 2>&1 && command -v redis-server >/dev/null 2>&1; then
    redis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
        --pidfile "$OUT/redis.pid" >/dev/null && STARTED_REDIS=1 && sleep 0.5
fi

declare -a SUMMARY=()
run() {
    local name=$1
    shift
    echo "=== $name: $PY $*"
    local start=$SECONDS
    "$PY" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err"
    local status=$?
    cat "$OUT/$name.txt"
    [[ $status -ne 0 ]] && tail -5 "$OUT/$name.err"
    SUMMARY+=("$(printf '%-16s exit %-3s %5ss' "$name" "$status" "$((SECONDS - start))")")
    echo
}

if [[ $LONG -eq 1 ]]; then
    run rule_processors bench/rule_processors.py
    run store_latency bench/store_latency.py --n 2000
    run compressors bench/compressors.py --long
    run incremental bench/incremental.py --long
    run fast_path bench/fast_path.py --rounds 100
    run sql_window bench/sql_window.py --windows 2000
    run serialization bench/serialization.py
    run fast_path_flat bench/fast_path_flat.py --long
    run http_load bench/http_load.py --duration 60
    run recall bench/recall.py --chunks 5000
    run soak bench/soak.py --redis-url redis://127.0.0.1:6379/11
    run throughput bench/throughput.py --long
    run turn_latency bench/turn_latency.py --long --plot "$OUT/turn_latency.png"
    run proxy bench/proxy.py --long
    run proxy_reply_memory bench/proxy_reply_memory.py --long
    run retention bench/retention.py --locomo-ratios 0.25 --json "$OUT/retention.json"
    run newest_output bench/newest_output.py
    run ui_page bench/ui_page.py --long
else
    run rule_processors bench/rule_processors.py
    run store_latency bench/store_latency.py
    run compressors bench/compressors.py
    run incremental bench/incremental.py
    run fast_path bench/fast_path.py
    run sql_window bench/sql_window.py
    run serialization bench/serialization.py
    run fast_path_flat bench/fast_path_flat.py --recall auto
    run http_load bench/http_load.py
    run recall bench/recall.py
    run soak bench/soak.py --duration 20 --conversations 20 --drain 20 --redis-url redis://127.0.0.1:6379/11
    run throughput bench/throughput.py
    run turn_latency bench/turn_latency.py --plot "$OUT/turn_latency.png"
    run proxy bench/proxy.py
    run proxy_reply_memory bench/proxy_reply_memory.py
    run retention bench/retention.py --quick --json "$OUT/retention.json"
    run newest_output bench/newest_output.py --budgets 16000 --lags 0 --cuts-per-run 1
    run ui_page bench/ui_page.py
fi

if [[ -n "$STARTED_REDIS" ]]; then
    redis-cli -p 6379 shutdown nosave >/dev/null 2>&1 || true
fi
echo "=== summary ($(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ))"
printf '%s\n' "${SUMMARY[@]}"
echo "total ${SECONDS}s; outputs in $OUT/"
