#!/usr/bin/env bash
# The benchmark of issue 5: etcd-steward against plain etcd on loopback, every agent figure
# as a ratio to its baseline measured in the same run. Writes BENCHMARKS.md (between its
# markers), bench/replacement.png and bench/results.json. Needs root (mount namespaces),
# etcd and dnsmasq (scripts/install-test-deps.sh) and wrk (installed here when missing).
#
#   scripts/bench.sh                              # the published run (see BENCHMARKS.md)
#   scripts/bench.sh --only formation,restart --runs 3 --out /tmp/b.md
#   scripts/bench.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .tools/etcd-v3.5.1/etcd ] || ! command -v dnsmasq >/dev/null; then
  bash scripts/install-test-deps.sh >/dev/null
fi
if ! command -v wrk >/dev/null; then
  apt-get update -qq && apt-get install -y -qq wrk >/dev/null
fi
# One build of both, so cargo resolves their shared dependencies' features once.
cargo build --release --locked -p etcd-steward -p etcd-steward-bench
target=${CARGO_TARGET_DIR:-target}
exec "$target/release/etcd-steward-bench" --steward-bin "$target/release/etcd-steward" "$@"
