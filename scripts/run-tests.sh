#!/bin/sh
# The test suite (tap) on this machine's Node, then, in CI (CI=true) or when
# TEST_NODE24=1, again on Node 24 (the current LTS, which the Docker image
# runs): the npm registry serves Node builds as the `node` package, so no other
# download source is needed.
set -eu
tap "$@"
if [ "${CI:-}" = "true" ] || [ "${TEST_NODE24:-}" = "1" ]; then
  echo "== the suite again on Node 24 =="
  npx --yes --package node@24 -c 'node --version && tap --disable-coverage'
fi
