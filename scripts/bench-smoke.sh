#!/usr/bin/env bash
# A short run of every benchmark scenario (one run, tiny data, no soak), to catch a broken
# benchmark, not to judge figures: exits non-zero if any scenario fails. Uses the debug
# build (the one the test suite makes); writes to target/bench-smoke/, never BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .tools/etcd-v3.5.1/etcd ] || ! command -v dnsmasq >/dev/null; then
  bash scripts/install-test-deps.sh >/dev/null
fi
if ! command -v wrk >/dev/null; then
  apt-get update -qq && apt-get install -y -qq wrk >/dev/null
fi
# One build of both, so cargo resolves their shared dependencies' features once.
cargo build --locked -p etcd-steward -p etcd-steward-bench
target=${CARGO_TARGET_DIR:-target}
exec "$target/debug/etcd-steward-bench" --steward-bin "$target/debug/etcd-steward" --smoke "$@"
