# Shared by the set-up scripts (sourced, not run): one progress line per step, everything else in "$log".

# quiet CMD...: run CMD with its output appended to "$log"; on failure name the step, the log and its end, and exit 1.
# "$quiet_what" says what failed (default: set-up).
quiet() {
  if ! "$@" >>"$log" 2>&1; then
    echo "${quiet_what:-set-up} failed: $*; the whole log is $log; its end:" >&2
    tail -n 25 "$log" >&2
    exit 1
  fi
}

# require_go MIN WHAT: exit 3 (the tests that need WHAT then skip and say why) unless a Go is here that builds it: a
# Go >= 1.21 fetches the toolchain a module asks for by itself (GOTOOLCHAIN=auto); older ones cannot.
require_go() {
  local hint="install Go >= $1 from https://go.dev/dl/ (Debian bookworm's golang is 1.19, too old; any Go >= 1.21 fetches the newer toolchain itself)"
  if ! command -v go >/dev/null; then
    echo "Go is missing: $hint to build $2" >&2
    exit 3
  fi
  local version
  version=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  if [ "$(printf '%s\n' "1.21" "${version:-0}" | sort -V | head -n 1)" != "1.21" ]; then
    echo "Go ${version:-of unknown version} is too old: $hint to build $2" >&2
    exit 3
  fi
}

# start_go_build MIN WHAT CACHE: the Go build scripts' start: `require_go MIN WHAT`, then "$log" = CACHE/build.log,
# emptied, with failures outside `quiet` (a module download read by a substitution) naming it too.
start_go_build() {
  require_go "$1" "$2"
  quiet_what=build
  mkdir -p "$3"
  log=$3/build.log
  : > "$log"
  trap 'echo "build failed at line $LINENO of $0; the whole log is $log; its end:" >&2; tail -n 25 "$log" >&2' ERR
}
