#!/usr/bin/env bash
# Runs hetero's tests (execution core: streams, DAG property test, priorities,
# allocation count) under AddressSanitizer.
#
#   ci/asan-exec.sh [extra cargo test args]
#
# Needs the sanitizer runtime that ships with rustc for x86_64 Linux; RUSTC_BOOTSTRAP
# unlocks `-Z` flags on a stable toolchain. `--target` keeps the flags off build
# scripts and proc macros. Leak checking is on (LeakSanitizer).
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="-Zsanitizer=address ${RUSTFLAGS:-}"
export RUSTDOCFLAGS="-Zsanitizer=address ${RUSTDOCFLAGS:-}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-asan}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1:abort_on_error=0}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"

cargo test -p hetero --target x86_64-unknown-linux-gnu "$@"
