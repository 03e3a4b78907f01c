#!/usr/bin/env bash
# On a machine with a GPU: what hetero's Vulkan backend sees there, then the
# integration suite and `hetero bench vulkan` on it. Usage: ci/gpu-check.sh [INDEX]
# (INDEX: the Vulkan device, as `hetero info` numbers them; default: the first
# that is not a CPU driver). Installs the Vulkan loader if missing; the GPU's
# own driver must already be installed. No figure from here is quoted unless
# this script was run on that machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
if ! ls /usr/lib/*/libvulkan.so.1 >/dev/null 2>&1; then
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y libvulkan1 vulkan-tools
fi
cargo build --release -p hetero-cli --features bench
HETERO="${CARGO_TARGET_DIR:-target}/release/hetero"

# The devices, their queue families (a transfer-only family is the copy
# engines), memory types and features (sparse binding among them).
"$HETERO" info
INDEX="${1:-}"
if [ -z "$INDEX" ]; then
  INDEX=$("$HETERO" info --json | python3 -c '
import json, sys
v = json.load(sys.stdin)["vulkan"]
if isinstance(v, dict):
    sys.exit("no Vulkan device: " + v.get("error", "unknown"))
gpus = [d for d in v if d["type"] != "cpu"]
if not gpus:
    sys.exit("only CPU Vulkan drivers here (lavapipe); this script is for a GPU")
print(gpus[0]["index"])')
fi
echo "== Vulkan device $INDEX"
"$HETERO" info --json | python3 -c '
import json, sys
d = json.load(sys.stdin)["vulkan"][int(sys.argv[1])]
print(d["details"])
print("queue plan:", d["queue_plan"])
fams = d["details"].split("queue families: ")[1].split("\n")[0]
print("transfer-only family:", "yes" if any(
    "TRANSFER" in f and "COMPUTE" not in f and "GRAPHICS" not in f for f in fams.split("; ")) else "no")
print("sparse binding:", "no" if "missing:" in d["details"] and "sparse-binding" in d["details"].split("missing:")[1] else "yes")
' "$INDEX"

echo "== integration suite on HETERO_BACKEND=vulkan:$INDEX"
HETERO_BACKEND="vulkan:$INDEX" HETERO_REQUIRE_VULKAN=1 cargo test --release -p hetero --tests
echo "== hetero-vulkan tests"
HETERO_REQUIRE_VULKAN=1 cargo test --release -p hetero-vulkan
echo "== the demo on the GPU"
"$HETERO" demo --device "vulkan:$INDEX"
echo "== hetero bench vulkan"
HETERO_BACKEND="vulkan:$INDEX" "$HETERO" bench vulkan
