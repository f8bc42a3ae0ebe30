#!/usr/bin/env bash
# `make run`: Redis, the engine and nginx on loopback, in the foreground
# with their logs; Ctrl-C stops all three. Ports: conf/run.env. Redis
# only shares the segment index: when it exits the other two serve on;
# when the engine or nginx exits, everything stops.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
. conf/run.env
build=${HYPIC_BUILD:-$repo/build}
run=$HYPIC_RUN_DIR
model=$(cd "$HYPIC_MODEL" && pwd)
sock=$run/engine.sock

mkdir -p "$run"/{logs,redis,nginx/logs,nginx/tmp}
pids=()
declare -A names
stop() {
    trap - INT TERM EXIT
    echo; echo "hypic: stopping"
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap stop INT TERM EXIT

redis-server --port "$HYPIC_REDIS_PORT" --bind 127.0.0.1 --save '' \
    --appendonly no --dir "$run/redis" --logfile '' \
    > >(sed -u 's/^/[redis] /') 2>&1 &
pids+=($!); names[$!]=redis

# shellcheck disable=SC2086 # HYPIC_ENGINE_FLAGS: words, as on a command line
"$build/hypic-engine" serve --config conf/engine.conf --model "$model" \
    --model-id default --peer-addr "127.0.0.1:$HYPIC_HTTP_PORT" \
    --socket "$sock" --redis "127.0.0.1:$HYPIC_REDIS_PORT" \
    $HYPIC_ENGINE_FLAGS > >(sed -u 's/^/[engine] /') 2>&1 &
pids+=($!); names[$!]=engine

sed -e "s|@PREFIX@|$run/nginx|g" -e "s|@PORT@|$HYPIC_HTTP_PORT|g" \
    -e "s|@ENGINE_SOCKET@|$sock|g" -e "s|@REDIS_PORT@|$HYPIC_REDIS_PORT|g" \
    -e "s|@REPO@|$repo|g" -e "s|@BUILD@|$build|g" -e "s|@USER@|$(id -un)|g" \
    conf/nginx.conf.in > "$run/nginx/nginx.conf"
"$HYPIC_NGINX" -p "$run/nginx" -c "$run/nginx/nginx.conf" -t -q
"$HYPIC_NGINX" -p "$run/nginx" -c "$run/nginx/nginx.conf" \
    -g 'daemon off;' > >(sed -u 's/^/[nginx] /') 2>&1 &
pids+=($!); names[$!]=nginx

for _ in $(seq 50); do
    curl -sf "http://127.0.0.1:$HYPIC_HTTP_PORT/health" >/dev/null && break
    sleep 0.2
done
cat <<MSG

HYPIC serve is up: nginx http://127.0.0.1:$HYPIC_HTTP_PORT, redis :$HYPIC_REDIS_PORT, engine $sock
model: $model

  curl -s http://127.0.0.1:$HYPIC_HTTP_PORT/health
  curl -sN http://127.0.0.1:$HYPIC_HTTP_PORT/v1/chat/completions \\
    -H 'Content-Type: application/json' \\
    -d '{"model":"default","stream":true,"max_tokens":32,
         "messages":[{"role":"user","content":"Hello!"}]}'

Ctrl-C stops all three.
MSG
while :; do
    gone='' status=0
    wait -n -p gone "${pids[@]}" || status=$?
    [ -n "${gone:-}" ] || break            # a signal: the trap stops all
    if [ "${names[$gone]}" != redis ]; then
        echo "hypic: ${names[$gone]} exited (status $status); stopping" \
             "the others" >&2
        break
    fi
    echo "hypic: redis exited (status $status); still serving without it:" \
         "requests are served on this node, no segment index is shared" >&2
    left=()
    for p in "${pids[@]}"; do [ "$p" = "$gone" ] || left+=("$p"); done
    pids=("${left[@]}")
done
