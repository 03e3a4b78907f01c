#!/usr/bin/env bash
# ci/gpu-check.sh for a GPU machine without a Rust toolchain or a package
# registry: build here, run there.
#   ci/gpu-kit.sh pack   (here) builds hetero's and hetero-vulkan's test binaries
#                        and the CLI in release, packs them into .devkit/kit.tar.xz,
#                        and downloads the Vulkan loader and the GL vendor-neutral
#                        libraries (which an NVIDIA Vulkan driver loads) into .gl/;
#                        both folders are git-ignored.
#   ci/gpu-kit.sh run    (there, in a copy of this tree holding .devkit and .gl)
#                        unpacks the debs into /, then runs the hetero-vulkan tests,
#                        the integration suite on `vulkan` and `vulkan:0,lanes=split`,
#                        `hetero bench vulkan --quick` and the demo; logs go to
#                        ${OUT:-/tmp/gpu-kit}, failures are printed at the end (and
#                        the exit status is 1). On lavapipe here it passes in a minute.
# Seen on an H200 machine (Ubuntu 24.04, NVIDIA driver 580): with the loader
# alone the loader found no device.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
pack)
  set -e
  grep -qx '/.devkit/' .git/info/exclude 2>/dev/null || echo /.devkit/ >>.git/info/exclude
  grep -qx '/.gl/' .git/info/exclude 2>/dev/null || echo /.gl/ >>.git/info/exclude
  kit=$(mktemp -d)
  mkdir -p "$kit/hetero" "$kit/vk"
  for pkg in hetero hetero-vulkan; do
    dir=$([ "$pkg" = hetero ] && echo hetero || echo vk)
    CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
      CARGO_TEST_ARGS="--release -p hetero -p hetero-vulkan" ci/test-binaries.sh "$pkg" |
      while read -r bin; do
        # Named by target (a package's tests/memory.rs and another's differ
        # by folder): the file name less cargo's hash.
        name=$(basename "$bin")
        cp "$bin" "$kit/$dir/${name%-*}"
      done
  done
  cargo build --release -p hetero-cli --features bench
  strip -o "$kit/hetero-cli" "${CARGO_TARGET_DIR:-target}/release/hetero"
  mkdir -p .devkit .gl
  tar -C "$kit" -cf - hetero vk hetero-cli | xz -T0 -9 >.devkit/kit.tar.xz
  rm -rf "$kit"
  lists=$(mktemp -d)
  mkdir -p "$lists/partial"
  o="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=$lists"
  # shellcheck disable=SC2086
  apt-get $o update >/dev/null
  # shellcheck disable=SC2086
  (cd .gl && apt-get $o download libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2)
  rm -rf "$lists"
  du -sh .devkit .gl
  ;;
run)
  out="${OUT:-/tmp/gpu-kit}"
  mkdir -p "$out"
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
  export HETERO_REQUIRE_VULKAN=1 RUST_BACKTRACE=1
  k=/tmp/gpu-kit-bin
  mkdir -p "$k" && tar -C "$k" -xJf .devkit/kit.tar.xz || exit 9
  { nvidia-smi -L; ldconfig -p | grep -i "vulkan\|GLdispatch"; "$k/hetero-cli" info; } >"$out/env.log" 2>&1
  (cd crates/hetero-vulkan && for b in "$k"/vk/*; do
    echo "-- vk $(basename "$b")"; timeout 60 "$b" -q; echo "rc=$?"; done) >"$out/vk.log" 2>&1
  suite() {
    (cd crates/hetero && for b in "$k"/hetero/*; do
      echo "-- $(basename "$b")"; HETERO_BACKEND="$1" timeout 90 "$b" -q; echo "rc=$?"; done) >"$out/$2" 2>&1
  }
  suite vulkan suite-vulkan.log
  timeout 100 "$k/hetero-cli" bench vulkan --quick >"$out/bench-vulkan.log" 2>&1
  echo "rc=$?" >>"$out/bench-vulkan.log"
  timeout 60 "$k/hetero-cli" demo --device vulkan --tiles 8 --reps 1 >"$out/demo.log" 2>&1
  echo "rc=$?" >>"$out/demo.log"
  suite vulkan:0,lanes=split suite-split.log
  # Exit status: 1 when any test binary, the bench or the demo failed.
  if grep -q "rc=[1-9]\|test result: FAILED\|panicked at" "$out"/*.log; then
    grep -h "rc=[1-9]\|test result: FAILED\|panicked at" "$out"/*.log | head -100
    exit 1
  fi
  echo "all passed; logs in $out"
  ;;
*)
  echo "usage: $0 pack|run" >&2
  exit 2
  ;;
esac
