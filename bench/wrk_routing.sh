#!/usr/bin/env bash
# Front-door overhead (issue 7 bench): routed requests/s and latency of
# routing-only completions through nginx + the engine, beside /health
# answered by nginx alone. Needs `make run` up (HYPIC_HTTP_PORT, default
# 8080) and wrk (apt-get install wrk). Loopback only; bounded runs.
set -euo pipefail
port=${HYPIC_HTTP_PORT:-8080}
url=http://127.0.0.1:$port
here=$(dirname "$0")
command -v wrk >/dev/null || { echo "wrk not installed" >&2; exit 2; }
echo "## routed completions (max_tokens 0), 2 threads, 16 connections"
wrk -t2 -c16 -d8s --latency -s "$here/wrk/post_route.lua" "$url/v1/completions"
echo "## the same, one connection (latency without queueing)"
wrk -t1 -c1 -d5s --latency -s "$here/wrk/post_route.lua" "$url/v1/completions"
echo "## /health (nginx alone), one connection"
wrk -t1 -c1 -d5s --latency "$url/health"
