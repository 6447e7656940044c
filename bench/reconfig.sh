#!/usr/bin/env bash
# WCF's "a reconfiguration is a pointer move", measured: the time to compile and apply a
# configuration of 1,000 clusters through the admin API, and the router's RSS across 1,000
# such applies. See `rondo-reconfig --help` and docs/benchmarks.md.
#
#   bench/reconfig.sh               1,000 clusters, 1,000 applies (a few minutes once built)
#   bench/reconfig.sh --no-build    use target/release/{rondo,rondo-reconfig} as they are
#   bench/reconfig.sh -- ARGS       passed to rondo-reconfig (e.g. -- --clusters 5000)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=1
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

if [ "$build" = 1 ]; then
  cargo build --release --locked -p rondo --bin rondo
  cargo build --release --locked -p rondo-bench --bin rondo-reconfig
fi
target/release/rondo-reconfig --rondo target/release/rondo "${extra[@]}"
