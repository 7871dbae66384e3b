#!/bin/sh
# `npm test`: every check and test file, the quick ones first, so that a
# broken change is reported in about a minute instead of at the end:
#   checks  type-check and lint, side by side;
#   fast    test/unit and test/store (`npm run test:quick` is checks + fast,
#           without coverage);
#   slow    every other test file: cluster, e2e, hardening (soak, chaos),
#           interop (conformance), packaging. Most of the time.
# A step that fails ends the run. Then, in CI (CI=true) or when TEST_NODE22=1,
# the whole suite again, as one tap run, on Node 22, the oldest line
# package.json's engines support (the first steps run on the Node on PATH:
# Node 24 in CI, .ci/run puts it first); the npm registry serves Node builds as
# the `node` package, so no other download source is needed.
#
# Coverage and its thresholds (.taprc) are over the whole suite: the slow tier
# runs as a tap --save run (the files its list names), which, unlike a full
# run, keeps the coverage already in .tap/coverage, so its report adds the
# fast tier's. The fast tier checks no threshold and prints no table.
#
# With test files as arguments: the checks, then one tap run of those files.
#
# A failing run ends with its failed assertions again, each with the start of
# its diagnostics: a CI log that keeps only its tail still says what failed.
set -eu

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log=$tmp/log
rc=$tmp/rc

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

# tsc and eslint each keep one core busy: side by side they take the time of the slower.
checks () {
  echo "== type-check and lint =="
  npm run --silent typecheck > "$tmp/typecheck" 2>&1 & typecheck=$!
  npm run --silent lint > "$tmp/lint" 2>&1 & lint=$!
  failed=""
  wait "$typecheck" || failed="$failed typecheck"
  wait "$lint" || failed="$failed lint"
  cat "$tmp/typecheck" "$tmp/lint"
  if [ -n "$failed" ]; then
    echo "== failed:$failed =="
    exit 1
  fi
}

checks
if [ "${1:-}" = "fast" ]; then
  echo "== fast tier =="
  run tap --disable-coverage test/unit test/store
  exit 0
fi
if [ $# -gt 0 ]; then
  run tap "$@"
  exit 0
fi

echo "== fast tier =="
run tap --coverage-report=none --statements=0 --branches=0 --functions=0 --lines=0 test/unit test/store
echo "== slow tier =="
# The files as .taprc's include and exclude find them, less the fast tier's.
tap list | grep -v -e '^test/unit/' -e '^test/store/' > "$tmp/slow"
run tap --save="$tmp/slow"

if [ "${CI:-}" = "true" ] || [ "${TEST_NODE22:-}" = "1" ]; then
  echo "== the suite again on Node 22 =="
  run npx --yes --package node@22 -c 'node --version && tap --disable-coverage'
fi
