#!/usr/bin/env bash
# Runs hetero-memory's tests under AddressSanitizer. With --cfg hetero_asan the
# pools poison freed and cached buffers, so a use-after-free through a stale
# pointer is reported although the memory stays mapped.
# Needs a nightly feature on a stable toolchain (RUSTC_BOOTSTRAP); the explicit
# --target keeps the sanitizer flags off build scripts and proc-macros.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="-Zsanitizer=address --cfg hetero_asan"
export RUSTDOCFLAGS="-Zsanitizer=address --cfg hetero_asan"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-asan}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}"
exec cargo test -p hetero-memory --target x86_64-unknown-linux-gnu --lib --tests "$@"
