#!/usr/bin/env bash
# The cumulative figure of chaos-results.tsv (written by tests/chaos.rs's open-ended run):
# schedules, faults, acknowledged writes, lost writes, split clusters, failed schedules and
# the longest refusal of writes.
set -euo pipefail
cd "$(dirname "$0")/.."
awk -F'\t' '!/^#/ && NF >= 7 {
  n++; f += $2; a += $3; l += $4; if ($5 > m) m = $5; if ($6 != 1) s++; if ($7 != "ok") x++
} END {
  printf "schedules %d, faults %d, acknowledged writes %d, lost %d, split clusters %d, failed schedules %d, longest refusal of writes %.1f s\n", n, f, a, l, s, x, m / 1000
}' chaos-results.tsv
