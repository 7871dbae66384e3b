#!/bin/sh
# The test suite (tap) on the Node on PATH (Node 24 in CI: .ci/run puts it
# first), then, in CI (CI=true) or when TEST_NODE22=1, again on Node 22, the
# oldest line package.json's engines support: the npm registry serves Node builds
# as the `node` package, so no other download source is needed.
#
# A failing run ends with its failed assertions again, each with the start of
# its diagnostics: a CI log that keeps only its tail still says what failed.
set -eu

log=$(mktemp)
rc=$(mktemp)
trap 'rm -f "$log" "$rc"' EXIT

run () {
  # On a terminal tap's own reporter lists the failures; a pipe would turn it off.
  if [ -t 1 ]; then "$@"; return; fi
  # The status through a file: a pipeline's is tee's. (`if` keeps set -e off the command.)
  { if "$@"; then echo 0 > "$rc"; else echo $? > "$rc"; fi; } 2>&1 | tee "$log"
  status=$(cat "$rc")
  status=${status:-1}
  if [ "$status" != 0 ]; then
    echo "== failed ($*: exit $status); the failures again =="
    grep -n -A14 '^ *not ok ' "$log" | head -300 || true
    exit "$status"
  fi
}

run tap "$@"
if [ "${CI:-}" = "true" ] || [ "${TEST_NODE22:-}" = "1" ]; then
  echo "== the suite again on Node 22 =="
  run npx --yes --package node@22 -c 'node --version && tap --disable-coverage'
fi
