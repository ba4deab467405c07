#!/usr/bin/env bash
# The whole test suite: unit tests, the decision table and its properties, the sidecar's
# HTTP surface, and the real-etcd scenarios (etcd 3.5.1, 3.5.30 and 3.4.23, dnsmasq,
# loopback pods). Needs root (each pod runs in its own mount namespace) and
# scripts/install-test-deps.sh.
#
# Every test binary runs (--no-fail-fast). A test that fails is run once more, alone: if
# it fails again the suite fails; if it passes it is named FLAKY in the output and in
# target/flaky-tests.txt (scripts/rerun-failures.py).
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp /tmp/steward-test-XXXXXX.log)
# The fault suite in .ci/run appends its flaky scenarios after this run's.
rm -f target/flaky-tests.txt
status=0
# The agent's tests and the harness's own (the chaos checker's rules, the write recorder).
# Scenarios are mostly waiting on etcd; three at a time fit two cores.
cargo test --locked --no-fail-fast -p etcd-steward -p etcd-steward-harness -- --test-threads="${STEWARD_TEST_THREADS:-3}" "$@" 2>&1 \
    | tee "$log" || status=$?
if [ "$status" -ne 0 ]; then
    python3 scripts/rerun-failures.py "$log"
fi
