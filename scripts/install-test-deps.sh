#!/usr/bin/env bash
# System packages the test suite needs: Debian's prometheus (prometheus + promtool) for the real-Prometheus tests.
set -euo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  exit 0
fi
if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
echo "installing Debian's prometheus package for the integration tests" >&2
$sudo apt-get update -qq
# policy-rc.d keeps the package from starting a system Prometheus on :9090; the tests start their own on loopback.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
  $sudo chmod +x /usr/sbin/policy-rc.d
  trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
fi
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
