#!/usr/bin/env bash
# Installs the Debian packages HYPIC serve builds and tests with, only the
# ones missing, so `make run` and `make test` are the only set-up needed.
# Idempotent: a second run with everything present touches nothing.
# iproute2 gives `ip`, which t/091 needs for its network namespaces.
# clang, libclang-rt-dev (libclang_rt.fuzzer, the sanitizers) and
# libomp-dev (clang's OpenMP) build the fuzz/ targets that t/099 runs;
# the meta packages keep the three on Debian's one clang version.
# libpython3-dev and python3-jinja2: the engine renders chat templates with
# jinja2 in an embedded Python (engine/tokenizer/chat.c).
set -euo pipefail

pkgs=(
    build-essential pkg-config dpkg-dev curl ca-certificates
    nginx nginx-dev libpcre2-dev
    libhiredis-dev redis-server
    libcjson-dev libxxhash-dev libutf8proc-dev libopenblas-openmp-dev
    libtest-base-perl
    iproute2
    clang libclang-rt-dev libomp-dev
    libpython3-dev python3-jinja2
)

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null \
            | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi

# Keep the package scripts from starting system nginx/redis on :80/:6379;
# our tests and `make run` start private instances on their own ports.
blocker=/usr/sbin/policy-rc.d
made_blocker=0
if [ ! -e "$blocker" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$blocker" >/dev/null
    $sudo chmod +x "$blocker"
    made_blocker=1
fi
trap '[ $made_blocker -eq 1 ] && $sudo rm -f "$blocker"' EXIT

$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
