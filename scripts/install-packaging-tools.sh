#!/bin/sh
# Installs the command-line tools test/packaging needs, from Debian packages:
#   docker-compose  validates docker-compose.yml (compose.test.ts)
#   redis-server    boots config/redis.conf (compose.test.ts)
# Idempotent: installs only what is missing. Needs root (CI runs as root); call it
# from `npm test` (its pretest step). It changes the machine only when a tool is
# missing, and then only as root; otherwise it says what to install.
set -eu

missing=""
command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || missing="$missing docker-compose"
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"

if [ -z "$missing" ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-packaging-tools: need root to apt-get install:$missing" >&2
  exit 1
fi
echo "install-packaging-tools: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # word splitting of the package list is intended
apt-get install -y -qq --no-install-recommends $missing
