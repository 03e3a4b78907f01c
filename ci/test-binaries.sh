#!/usr/bin/env bash
# Prints the paths of one package's test binaries (its unit tests and tests/*.rs) as
# the workspace build makes them, building them first if needed. Usage: $0 PACKAGE
# (CARGO_TEST_ARGS: what to build instead of `--workspace`, e.g. `--release -p hetero`.)
set -euo pipefail
pkg="${1:?usage: $0 PACKAGE}"
# shellcheck disable=SC2086
cargo test ${CARGO_TEST_ARGS:---workspace} --tests --no-run --message-format=json | python3 -c '
import json, sys
pkg = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    # package_id looks like "path+file:///.../crates/hetero#0.1.0"
    name = m["package_id"].split("#")[0].rstrip("/").rsplit("/", 1)[-1]
    if m["profile"]["test"] and t["kind"] in (["test"], ["lib"]) and name == pkg:
        print(m["executable"])
' "$pkg"
