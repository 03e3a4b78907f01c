#!/usr/bin/env bash
# Model-checks the lock-free parts with loom: the op ring (submission queue), the
# timeline and parker (events, host waits), hetero-trace's chunked log,
# hetero-memory's try-lock and hetero-sync, the loom facade they all import.
#
#   ci/loom.sh            # every loom test
#   ci/loom.sh timeline   # only those whose name contains "timeline"
#
# Loom explores every interleaving of each test, so the tests are tiny and run in
# release mode. `LOOM_MAX_PREEMPTIONS=2` bounds a run that grows too long (at the
# cost of completeness); unset, the exploration is exhaustive.
set -euo pipefail
cd "$(dirname "$0")/.."

filter="${1:-loom}"
export RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}"
# A separate target dir: cfg(loom) rebuilds every crate.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-loom}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"

echo "== loom: hetero"
cargo test -p hetero --release --lib "$filter"

echo "== loom: hetero-trace"
cargo test -p hetero-trace --release --lib "$filter"

echo "== loom: hetero-memory"
cargo test -p hetero-memory --release --lib "$filter"

echo "== loom: hetero-sync"
cargo test -p hetero-sync --release --lib "$filter"

