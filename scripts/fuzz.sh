#!/usr/bin/env bash
# A short fuzz run of every target (default 20 s each) from the committed corpus.
# cargo fuzz needs nightly-only flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-20}
# Installed under $CARGO_TOOLS_ROOT when set (.ci/run keeps it in its cache), else cargo's own.
tools_root=${CARGO_TOOLS_ROOT:-${CARGO_HOME:-$HOME/.cargo}}
export PATH="$tools_root/bin:$PATH"
command -v cargo-fuzz >/dev/null || cargo install --root "$tools_root" --locked --quiet cargo-fuzz
export RUSTC_BOOTSTRAP=1
cd fuzz
# Its own target directory (its flags differ from the test build's, which they would
# otherwise rebuild): FUZZ_TARGET_DIR (CI keeps it outside the checkout), else fuzz/target.
export CARGO_TARGET_DIR=${FUZZ_TARGET_DIR:-target}
for target in peer_report wal_metadata config; do
  # Fuzz into a scratch copy so CI does not grow the committed corpus.
  work=$(mktemp -d)
  cp -r "corpus/$target/." "$work/"
  cargo fuzz run --sanitizer none "$target" "$work" -- -max_total_time="$seconds" -rss_limit_mb=2048 2>&1 | tail -n 3
  rm -rf "$work"
done
