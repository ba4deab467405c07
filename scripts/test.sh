#!/usr/bin/env bash
# The whole test suite: unit tests, the decision table and its properties, the sidecar's
# HTTP surface, and the real-etcd scenarios (etcd 3.5.1 and 3.4.23, dnsmasq, loopback pods).
# Needs root (each pod runs in its own mount namespace) and scripts/install-test-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# Scenarios are mostly waiting on etcd; three at a time fit two cores.
exec cargo test --locked --no-fail-fast -- --test-threads="${STEWARD_TEST_THREADS:-3}" "$@"
