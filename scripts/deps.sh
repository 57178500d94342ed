#!/usr/bin/env bash
# Installs the Debian packages netrun needs, only those that are missing.
# Run as root on Debian 12. Usage: scripts/deps.sh [extra packages...]
set -euo pipefail

PACKAGES=(
  gcc make cmake pkg-config             # build
  lua5.4 liblua5.4-dev libedit-dev      # the runtime and its REPL
  lua-busted lua-socket                 # Lua specs and their independent client
  lua-ldoc lua-markdown luarocks        # the API reference (docs/config.ld), the rockspec
  libssl-dev                            # TLS (OpenSSL 3)
  zlib1g-dev                            # WebSocket permessage-deflate
  libc-ares-dev                         # netrun.dns: the asynchronous resolver
  libnghttp2-dev                        # HTTP/2
  curl redis-tools netcat-openbsd       # real clients used by tests
  redis-server                          # examples/counter.lua (deploy_spec), the stream client's spec
  openssl                               # test certificates, s_client as a TLS peer
  python3-prometheus-client             # parses netrun.metrics output in metrics_spec
  procps iproute2 util-linux tmux       # ps, ss, setarch, taskset, a pty for REPL tests
  clang libclang-rt-dev                 # libFuzzer targets
  wrk                                   # benchmarks
  lintian                               # checks the Debian package (package_spec)
  nginx nodejs                          # peers: HTTP servers for the client specs, Node's https for TLS
  python3-websockets                    # WebSocket peers (spec/websocket_spec.lua)
  nghttp2-client nghttp2-server h2o     # HTTP/2 peers: nghttp, h2load, nghttpd, h2o
  python3-h2 python3-hyperframe         # HTTP/2 frames by hand (spec/http2_conformance.py)
  nats-server                           # NATS peers (spec/nats_spec.lua, nats_cluster_spec.lua)
)
PACKAGES+=("$@")

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
    missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # nginx and redis-server are peers the tests start on loopback ports of
  # their own: the packages' own services (nginx on *:80) are not started.
  policy=/usr/sbin/policy-rc.d
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
