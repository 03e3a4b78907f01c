#!/usr/bin/env bash
# Runs the whole test suite under AddressSanitizer. With --cfg hetero_asan the pools
# also poison freed and cached buffers, so a use-after-free through a stale pointer
# is reported although the memory stays mapped. LeakSanitizer reports what no test
# frees (see ci/lsan.supp for the few things kept until exit on purpose).
# Needs a nightly feature on the stable toolchain (RUSTC_BOOTSTRAP); the explicit
# --target keeps the sanitizer flags off build scripts and proc-macros.
#
#   ci/asan.sh                 # every crate
#   ci/asan.sh -p hetero       # one crate
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="-Zsanitizer=address --cfg hetero_asan"
export RUSTDOCFLAGS="-Zsanitizer=address --cfg hetero_asan"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-asan}"
# LeakSanitizer is on: memory kept on purpose until exit is listed, each with
# its reason, in ci/lsan.supp, and nothing else may leak.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/ci/lsan.supp:print_suppressions=0}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
if [ $# -eq 0 ]; then set -- --workspace; fi
exec cargo test --target x86_64-unknown-linux-gnu --lib --tests "$@"
