#!/usr/bin/env bash
# The cumulative figure of chaos-results.tsv (written by tests/chaos.rs's open-ended run):
# schedules, faults, acknowledged writes, lost writes, split clusters, failed schedules and
# the longest refusal of writes; then the same for the schedules of generator 2 and later
# (with partitions, full disks, backups and defragmentation; column 9, absent on older lines).
set -euo pipefail
cd "$(dirname "$0")/.."
awk -F'\t' '!/^#/ && NF >= 7 {
  n++; f += $2; a += $3; l += $4; if ($5 > m) m = $5; if ($6 != 1) s++; if ($7 != "ok") x++
  if (NF >= 9 && $9 >= 2) { n2++; f2 += $2; a2 += $3; l2 += $4; if ($6 != 1) s2++; if ($7 != "ok") x2++ }
} END {
  printf "schedules %d, faults %d, acknowledged writes %d, lost %d, split clusters %d, failed schedules %d, longest refusal of writes %.1f s\n", n, f, a, l, s, x, m / 1000
  printf "of which with partitions, full disks, backups and defragmentation (generator 2): schedules %d, faults %d, acknowledged writes %d, lost %d, split clusters %d, failed schedules %d\n", n2, f2, a2, l2, s2, x2
}' chaos-results.tsv
