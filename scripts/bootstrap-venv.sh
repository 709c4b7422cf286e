#!/usr/bin/env bash
# Create the project's virtualenv and install the project with its test tools, pinned by constraints.txt.
# On a fresh Debian machine python3 lacks venv/ensurepip; install python3-venv when we may (root or sudo).
# One line per step on stderr; what pip and apt print goes to <venv>/bootstrap.log, shown (its end) only on failure.
set -euo pipefail
python=${1:-python3}
venv=${2:-.venv}

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "koord-recommender needs Python >= 3.11; $python is $("$python" --version 2>&1)" >&2
  exit 1
fi
mkdir -p "$venv"
log=$venv/bootstrap.log
: > "$log"
# shellcheck source=scripts/setup-lib.sh
. "$(dirname "$0")/setup-lib.sh"
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "set-up: installing Debian's python3-venv (python3 has no venv/ensurepip)" >&2
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  quiet $sudo apt-get update
  quiet $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "set-up: creating the virtualenv $venv" >&2
  quiet "$python" -m venv "$venv"
fi
echo "set-up: installing koord-recommender and its dependencies into $venv (pinned; a few minutes the first time)" >&2
quiet "$venv/bin/python" -m pip install --upgrade pip
quiet "$venv/bin/python" -m pip install -c constraints.txt -e '.[dev]'
# matplotlib builds its font cache on first import and says so: do it here, into the log, not in the demo's output.
quiet "$venv/bin/python" -c 'import matplotlib.font_manager'
