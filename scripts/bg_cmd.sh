#!/bin/sh
# Cron wrapper: run one downcluster command in the background-safe way cron needs:
# from the checkout, with the virtualenv's downcluster, logging to var/log/<command>.log.
#   */5 * * * * cd /srv/downcluster && scripts/bg_cmd.sh dispatch
set -eu
cd "$(dirname "$0")/.."
[ -f ./env.sh ] && . ./env.sh          # optional: DOWNCLUSTER_* settings of this host
mkdir -p var/log
exec ./.venv/bin/downcluster "$@" >>"var/log/$1.log" 2>&1
