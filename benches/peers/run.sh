#!/usr/bin/env bash
# Tessera beside graphile-worker on one PostgreSQL server, and Tessera on
# SQLite; prints markdown tables (see benches/src/bin/peers.rs).
#
#   benches/peers/run.sh [JOBS] [postgres|sqlite]
#
# TESSERA_BENCH_POSTGRES_URL names the server (default: the local one at
# postgres://postgres:postgres@127.0.0.1:5432/postgres); the bench makes
# the databases tessera_bench and graphile_bench there. graphile-worker
# (the version package.json pins) is installed with npm into
# TESSERA_PEER_GRAPHILE (default: ${TMPDIR:-/tmp}/tessera-peer), outside
# the repository, the first time.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export TESSERA_BENCH_POSTGRES_URL="${TESSERA_BENCH_POSTGRES_URL:-postgres://postgres:postgres@127.0.0.1:5432/postgres}"
export TESSERA_PEER_GRAPHILE="${TESSERA_PEER_GRAPHILE:-${TMPDIR:-/tmp}/tessera-peer}"

mkdir -p "$TESSERA_PEER_GRAPHILE"
if ! cmp -s "$here/package.json" "$TESSERA_PEER_GRAPHILE/package.json" \
    || [ ! -d "$TESSERA_PEER_GRAPHILE/node_modules/graphile-worker" ]; then
    cp "$here/package.json" "$TESSERA_PEER_GRAPHILE/package.json"
    (cd "$TESSERA_PEER_GRAPHILE" && npm install --no-audit --no-fund --loglevel=error)
fi

cd "$here/../.."
cargo run --release -p tessera-benches --bin peers -- "$@"
