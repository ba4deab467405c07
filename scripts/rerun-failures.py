#!/usr/bin/env python3
"""Reruns, one at a time, each test a `cargo test` run reported FAILED.

Usage: rerun-failures.py LOG [ARG...]   (LOG: the whole output of the `cargo test` run;
ARGs go to the test binary with each rerun, e.g. `--ignored --nocapture` for the Docker fault
suite, whose scenarios are ignored by default)

A test that fails again fails the suite. A test that passes alone is reported as FLAKY,
by name, here and in target/flaky-tests.txt, and does not. A run that failed without
naming any failed test (a build error, a crashed test binary) fails the suite.
"""
import re
import subprocess
import sys
from pathlib import Path

RUNNING = re.compile(r"^\s*Running (unittests )?(\S+)")
FAILED = re.compile(r"^test (\S+) \.\.\. FAILED")


def target(source: str) -> list[str]:
    """The cargo arguments that select the test binary built from `source`."""
    if source == "src/lib.rs":
        return ["--lib"]
    if source == "src/main.rs":
        return ["--bin", "etcd-steward"]
    return ["--test", Path(source).stem]


def failures(log: str) -> list[tuple[list[str], str]]:
    found, current = [], None
    for line in log.splitlines():
        if m := RUNNING.match(line):
            current = target(m.group(2))
        elif (m := FAILED.match(line)) and current is not None:
            found.append((current, m.group(1)))
    return found


def main() -> int:
    failed = failures(Path(sys.argv[1]).read_text(errors="replace"))
    extra = sys.argv[2:]
    if not failed:
        print("rerun-failures: the run failed but named no failed test; not retrying")
        return 1
    flaky, broken = [], []
    for args, name in failed:
        print(f"\n=== rerunning alone: {' '.join(args)} {name}", flush=True)
        cmd = ["cargo", "test", "--locked", *args, "--", "--exact", name, "--test-threads=1", *extra]
        run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(run.stdout, flush=True)
        # It passed only if it ran: a name that matches no test runs nothing and exits 0.
        passed = run.returncode == 0 and "test result: ok. 1 passed" in run.stdout
        (flaky if passed else broken).append(f"{' '.join(args)} {name}")
    Path("target").mkdir(exist_ok=True)
    with Path("target/flaky-tests.txt").open("a") as f:
        f.write("".join(f"{t}\n" for t in flaky))
    for t in flaky:
        print(f"FLAKY (failed in the suite, passed alone): {t}")
    for t in broken:
        print(f"FAILED twice: {t}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
