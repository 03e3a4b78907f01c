#!/usr/bin/env bash
# Loom model check of the recorder's per-thread log (writer/reader races).
# Separate target dir so the cfg(loom) build does not evict the normal one.
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p hetero-trace --release loom
