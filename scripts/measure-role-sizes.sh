#!/usr/bin/env bash
# What each image role installs: a fresh virtualenv per role with the project installed from this checkout with
# that extra (pinned by constraints.txt, as the Dockerfile does), measured with du. An empty virtualenv is the
# reference (what the base image already has). Prints a markdown table; progress goes to stderr.
# Usage: [ROLES='serve train dask all'] scripts/measure-role-sizes.sh [python3] [workdir]
set -euo pipefail
python=${1:-python3}
work=${2:-$(mktemp -d)}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
"$python" -m venv "$work/empty"
empty=$(du -sm "$work/empty" | cut -f1)
echo "| role | extras | installed (MiB, above an empty venv) | packages | imports checked |"
echo "|---|---|---|---|---|"
for role in ${ROLES:-serve train dask all}; do
  echo "installing the $role role into $work/$role" >&2
  rm -rf "$work/$role"
  "$python" -m venv "$work/$role"
  "$work/$role/bin/python" -m pip install --quiet -c "$repo/constraints.txt" "$repo[$role]" >&2
  size=$(( $(du -sm "$work/$role" | cut -f1) - empty ))
  packages=$("$work/$role/bin/python" -m pip list --format=freeze 2>/dev/null | wc -l)
  case $role in
    serve) check="import serving.app, serving.controllers.status, serving.controllers.cluster_view" ;;
    train) check="import pipelines.train, pipelines.prometheus" ;;
    dask) check="import pipelines.distributed" ;;
    all) check="import pipelines.distributed, serving.app, presentation.charts" ;;
  esac
  (cd "$work" && "$work/$role/bin/python" -c "$check") >&2
  echo "| $role | \`.[$role]\` | $size | $packages | \`$check\` |"
done
