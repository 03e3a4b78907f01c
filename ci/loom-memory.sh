#!/usr/bin/env bash
# loom models of hetero-memory's lock-free code (the per-stream slot try-lock).
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg loom"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-loom}"
exec cargo test -p hetero-memory --release --lib loom_tests "$@"
