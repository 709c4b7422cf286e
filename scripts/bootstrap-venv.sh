#!/usr/bin/env bash
# Create the project's virtualenv and install the project with its test tools, pinned by constraints.txt.
# On a fresh Debian machine python3 lacks venv/ensurepip; install python3-venv when we may (root or sudo).
set -euo pipefail
python=${1:-python3}
venv=${2:-.venv}

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "koord-recommender needs Python >= 3.11; $python is $("$python" --version 2>&1)" >&2
  exit 1
fi
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "installing Debian's python3-venv (python3 has no venv/ensurepip)" >&2
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq python3-venv
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -c constraints.txt -e '.[dev]'
