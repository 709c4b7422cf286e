#!/usr/bin/env bash
# System packages the test suite needs, from Debian: prometheus (prometheus + promtool) for the real-Prometheus
# tests and chromium for the dashboard's browser tests. Only what is missing is installed.
set -euo pipefail
packages=()
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  packages+=(prometheus)
fi
if ! command -v chromium >/dev/null; then
  packages+=(chromium)
fi
if [ ${#packages[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
echo "installing Debian packages for the tests: ${packages[*]}" >&2
$sudo apt-get update -qq
# policy-rc.d keeps the package from starting a system Prometheus on :9090; the tests start their own on loopback.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
  $sudo chmod +x /usr/sbin/policy-rc.d
  trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
fi
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
