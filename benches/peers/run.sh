#!/usr/bin/env bash
# Tessera beside graphile-worker and pg-boss on one PostgreSQL server, and
# Tessera on SQLite; prints markdown tables (see benches/src/bin/peers.rs).
#
#   benches/peers/run.sh [JOBS] [postgres|sqlite]
#
# JOBS (default 10,000) no-op jobs a step. On PostgreSQL every step runs
# for the three systems in turn, in two regimes, each one set of tables:
# the server's defaults, then `synchronous_commit = off` for every session
# of the three databases (ALTER DATABASE … SET, reset at the end); each
# regime runs its steps TESSERA_PEERS_ROUNDS times (default 3) and reports
# the medians, and Tessera's rate over each peer's round by round, with
# the median and the lowest. The steps: enqueue one per call, then 1,000
# per call before each processing step; process one job at a time with 1,
# 2, 4 and 8 workers, then batched (100) with 1, 4 and 8. A worker count is
# that many workers of one process sharing one worker loop: for Tessera,
# threads sharing one `Worker` (one at a time with its defaults; batched
# fetching 100 with held acknowledgements). Each step also runs Tessera's
# direct store calls (the submit_and_claim loop; claim_batch +
# submit_batch) on a schema of its own, shown as extra rows.
#
# Environment (all optional):
#   TESSERA_BENCH_POSTGRES_URL  the server (default: the local one at
#       postgres://postgres:postgres@127.0.0.1:5432/postgres); the bench
#       makes the databases tessera_bench, graphile_bench and pgboss_bench.
#   TESSERA_PEER_GRAPHILE  where the peers are installed (default:
#       ${TMPDIR:-/tmp}/tessera-peer, outside the repository): npm installs
#       there, the first time and whenever package.json changes, the
#       versions package.json pins, graphile-worker, pg-boss and the Node
#       both ask for (22), which then runs the peers' scripts.
#   TESSERA_PEERS_WITH     the peers: graphile, pgboss, or both (default),
#       separated by a comma; none for Tessera alone.
#   TESSERA_PEERS_REGIMES  default, off, or both (default).
#   TESSERA_PEERS_ROUNDS   rounds of every step in each regime (default 3).
#   TESSERA_PEERS_STEPS    the processing steps to run, by worker count, b
#       for batched, in order (for example 1,4,8b: one at a time with 1
#       and 4 workers, batched with 8; each for every system).
#   TESSERA_PEERS_POOL     Tessera's pool size (default twice the cores).
#   TESSERA_PEERS_DEBUG    set: each peer's script says what `SHOW
#       synchronous_commit` answers on its own pool.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export TESSERA_BENCH_POSTGRES_URL="${TESSERA_BENCH_POSTGRES_URL:-postgres://postgres:postgres@127.0.0.1:5432/postgres}"
export TESSERA_PEER_GRAPHILE="${TESSERA_PEER_GRAPHILE:-${TMPDIR:-/tmp}/tessera-peer}"

mkdir -p "$TESSERA_PEER_GRAPHILE"
if ! cmp -s "$here/package.json" "$TESSERA_PEER_GRAPHILE/package.json" \
    || [ ! -d "$TESSERA_PEER_GRAPHILE/node_modules/graphile-worker" ] \
    || [ ! -d "$TESSERA_PEER_GRAPHILE/node_modules/pg-boss" ] \
    || [ ! -x "$TESSERA_PEER_GRAPHILE/node_modules/.bin/node" ]; then
    cp "$here/package.json" "$TESSERA_PEER_GRAPHILE/package.json"
    (cd "$TESSERA_PEER_GRAPHILE" && npm install --no-audit --no-fund --loglevel=error)
fi

cd "$here/../.."
cargo run --release -p tessera-benches --bin peers -- "$@"
