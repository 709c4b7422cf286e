#!/usr/bin/env bash
# System packages the test suite needs, from Debian: prometheus (prometheus + promtool) for the real-Prometheus
# tests and chromium for the dashboard's browser tests. Only what is missing is installed.
# One line on stderr when something is installed; apt's output goes to a log (KOORD_SETUP_LOG_DIR, default .venv),
# shown (its end) only on failure.
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
log_dir=${KOORD_SETUP_LOG_DIR:-.venv}
mkdir -p "$log_dir"
log=$log_dir/test-deps.log
: > "$log"
# shellcheck source=scripts/setup-lib.sh
. "$(dirname "$0")/setup-lib.sh"
if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
echo "set-up: installing Debian packages for the tests: ${packages[*]}" >&2
quiet $sudo apt-get update
# policy-rc.d keeps the package from starting a system Prometheus on :9090; the tests start their own on loopback.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
  $sudo chmod +x /usr/sbin/policy-rc.d
  trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
fi
quiet $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}"
