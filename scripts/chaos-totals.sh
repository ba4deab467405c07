#!/usr/bin/env bash
# The cumulative figure of chaos-results.tsv (written by tests/chaos.rs's open-ended run):
# schedules, faults, acknowledged writes, lost writes, split clusters, failed schedules and
# the longest refusal of writes; then the same for the schedules of generator 2 (with
# partitions, full disks, backups and defragmentation; column 9, absent on older lines).
# Generator 3's and 4's schedules (each ending in a disaster: every volume lost, or a majority
# lost for good; generator 4 also every volume lost with a wrong backup key first) are counted
# apart, each, on a line of their own, and in neither figure above: their
# outages are the disaster's, and after every volume is lost the writes acknowledged after
# the newest backup are lost by design ("lost" counts only writes that had to survive).
# Generator 5's schedules (generator 2's faults and a value corrupted on a pod's disk, which
# the agent must heal) count in the figure and on a line of their own too; so do generator 6's
# (generator 2's faults with Kubernetes' own API server as the writer).
# The last line: the longest refusal of writes that no fault explained (column 10, absent on
# lines written before it existed), over every generator.
set -euo pipefail
cd "$(dirname "$0")/.."
awk -F'\t' '!/^#/ && NF >= 7 {
  if (NF >= 10) { nu++; if ($10 > mu) mu = $10 }
  if (NF >= 9 && $9 == 4) {
    n4++; f4 += $2; a4 += $3; l4 += $4; if ($5 > m4) m4 = $5; if ($6 != 1) s4++; if ($7 != "ok") x4++
    next
  }
  if (NF >= 9 && $9 == 3) {
    n3++; f3 += $2; a3 += $3; l3 += $4; if ($5 > m3) m3 = $5; if ($6 != 1) s3++; if ($7 != "ok") x3++
    next
  }
  n++; f += $2; a += $3; l += $4; if ($5 > m) m = $5; if ($6 != 1) s++; if ($7 != "ok") x++
  if (NF >= 9 && $9 == 5) { n5++; f5 += $2; a5 += $3; l5 += $4; if ($6 != 1) s5++; if ($7 != "ok") x5++ }
  if (NF >= 9 && $9 == 6) { n6++; f6 += $2; a6 += $3; l6 += $4; if ($6 != 1) s6++; if ($7 != "ok") x6++ }
  if (NF >= 9 && $9 == 2) { n2++; f2 += $2; a2 += $3; l2 += $4; if ($6 != 1) s2++; if ($7 != "ok") x2++ }
} END {
  printf "schedules %d, faults %d, acknowledged writes %d, lost %d, split clusters %d, failed schedules %d, longest refusal of writes %.1f s\n", n, f, a, l, s, x, m / 1000
  printf "of which with partitions, full disks, backups and defragmentation (generator 2): schedules %d, faults %d, acknowledged writes %d, lost %d, split clusters %d, failed schedules %d\n", n2, f2, a2, l2, s2, x2
  printf "disasters (generator 3, counted apart): schedules %d, faults and disasters %d, acknowledged writes %d, lost of those that had to survive %d, split clusters %d, failed schedules %d, longest refusal of writes %.1f s\n", n3, f3, a3, l3, s3, x3, m3 / 1000
  printf "disasters with a wrong backup key among them (generator 4, counted apart): schedules %d, faults and disasters %d, acknowledged writes %d, lost of those that had to survive %d, split clusters %d, failed schedules %d, longest refusal of writes %.1f s\n", n4, f4, a4, l4, s4, x4, m4 / 1000
  printf "of which with a value corrupted on disk and healed by the agent (generator 5): schedules %d, faults %d, acknowledged writes %d, lost %d, split clusters %d, failed schedules %d\n", n5, f5, a5, l5, s5, x5
  printf "of which written by Kubernetes' API server (generator 6): schedules %d, faults %d, acknowledged objects %d, lost %d, split clusters %d, failed schedules %d\n", n6, f6, a6, l6, s6, x6
  printf "longest refusal of writes no fault explained (column 10, schedules since it exists: %d): %.1f s\n", nu, mu / 1000
}' chaos-results.tsv
