#!/usr/bin/env bash
# Supply chain: licenses, bans and sources (cargo deny, deny.toml), and known advisories
# (cargo audit) against the RustSec snapshot in ../shared/advisory-db, read offline.
# Online, users run plain `cargo audit` (it fetches the current database).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-deny >/dev/null || cargo install --locked --quiet cargo-deny
command -v cargo-audit >/dev/null || cargo install --locked --quiet cargo-audit
cargo deny --log-level error check bans licenses sources
db=${ADVISORY_DB:-../shared/advisory-db}
if [ -d "$db" ]; then
  echo "advisory snapshot: $(head -1 "$db/SNAPSHOT" 2>/dev/null || echo undated)"
  cargo audit --db "$db" --no-fetch --stale
else
  echo "no advisory snapshot at $db: set ADVISORY_DB, or run 'cargo audit' online" >&2
  exit 1
fi
