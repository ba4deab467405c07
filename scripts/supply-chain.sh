#!/usr/bin/env bash
# Supply chain: licenses, bans and sources (cargo deny, deny.toml), and known advisories
# (cargo audit) against the RustSec snapshot in ../shared/advisory-db, read offline.
# Online, users run plain `cargo audit` (it fetches the current database).
set -euo pipefail
cd "$(dirname "$0")/.."
# Built for a one-off check, not for speed: no LTO, many codegen units, opt-level 1
# (cargo-deny's own profile asks for fat LTO and one unit): here cargo-deny builds in 1m54s
# instead of 2m46s and cargo-audit in 4m15s instead of 4m50s; each check takes about a second.
tool_build=(env CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_OPT_LEVEL=1)
# Installed under $CARGO_TOOLS_ROOT when set (.ci/run keeps them in its cache), else cargo's own.
tools_root=${CARGO_TOOLS_ROOT:-${CARGO_HOME:-$HOME/.cargo}}
export PATH="$tools_root/bin:$PATH"
command -v cargo-deny >/dev/null || "${tool_build[@]}" cargo install --root "$tools_root" --locked --quiet cargo-deny
command -v cargo-audit >/dev/null || "${tool_build[@]}" cargo install --root "$tools_root" --locked --quiet cargo-audit
cargo deny --log-level error check bans licenses sources
# The snapshot sits beside the checkout (../shared/advisory-db); CI may clone elsewhere.
db=""
for candidate in "${ADVISORY_DB:-}" ../shared/advisory-db /work/shared/advisory-db; do
  if [ -n "$candidate" ] && [ -d "$candidate" ]; then db=$candidate; break; fi
done
if [ -n "$db" ]; then
  echo "advisory snapshot $db: $(head -1 "$db/SNAPSHOT" 2>/dev/null || echo undated)"
  cargo audit --db "$db" --no-fetch --stale
else
  # Without a database there is nothing to check against; say so loudly rather than fail
  # the build on a missing file. Online, `cargo audit` fetches the current database.
  echo "WARNING: no RustSec advisory snapshot found (set ADVISORY_DB); cargo audit skipped" >&2
fi
