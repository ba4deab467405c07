#!/usr/bin/env bash
# Mutation run: proves each guarantee's tests fail when the guarantee is broken.
#
#   scripts/mutants.sh [--runs N] [--only NAME] [--no-baseline]
#
# For every patch in ../shared/mutations/ (a patch of the same name in tests/mutations/
# wins: a copy refreshed where the code it breaks has moved), this
#   1. copies the checkout's files (tracked and new, not ignored) to a scratch tree,
#      target/mutants/tree, and applies the patch there (the checkout is never touched);
#   2. builds the tests that scripts/mutants.tsv names for it (one CARGO_TARGET_DIR,
#      target/mutants/target, so only the crate is rebuilt from one mutant to the next);
#   3. runs those tests N times (--runs, 2 by default); a test that `.ci/run` runs must
#      fail in every run for the mutant to count as KILLED. Failing in some runs only is
#      FLAKY, and counts as survived, as it would not fail CI (scripts/rerun-failures.py).
#      Ignored tests never run here: only what `.ci/run` runs can kill a mutant.
# Before the mutants, the same tests run once on the unpatched tree (the baseline): a
# test that fails there proves nothing, and the run stops.
#
# The table goes to stdout and to target/mutants/report.md; the exit status is 0 only when
# every mutant is killed. Needs what scripts/test.sh needs (root, install-test-deps.sh).
# Long (each mutant rebuilds the crate and runs real-etcd scenarios): not part of CI; its
# last table is in docs/TESTING.md with the commit it ran at.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)

runs=2
only=""
baseline=1
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs="$2"; shift 2 ;;
        --only) only="$2"; shift 2 ;;
        --no-baseline) baseline=0; shift ;;
        *) echo "usage: scripts/mutants.sh [--runs N] [--only NAME] [--no-baseline]" >&2; exit 64 ;;
    esac
done
[ "$runs" -ge 1 ] 2>/dev/null || { echo "--runs must be a whole number of at least 1" >&2; exit 64; }

shared="$top/../shared/mutations"
own="$top/tests/mutations"
table="$top/scripts/mutants.tsv"
work="$top/target/mutants"
tree="$work/tree"
logs="$work/logs"
mkdir -p "$work" "$logs"
export CARGO_TARGET_DIR="$work/target"
# Keep the scenarios' loopback networks apart from another suite on the machine.
export STEWARD_TEST_NET="${STEWARD_TEST_NET:-190}"

# The first build of the scratch tree starts from the checkout's own build when there is
# one (or MUTANTS_SEED_FROM, another target directory, e.g. CI's): the dependencies are the
# same files at the same paths, so cargo reuses them.
# The workspace's own crates are built anew at the scratch tree's path: their artifacts
# (the test binaries are hundreds of MB each) are not copied.
seed=${MUTANTS_SEED_FROM:-$top/target}/debug
if [ ! -d "$CARGO_TARGET_DIR/debug" ] && [ -d "$seed/deps" ]; then
    echo "seeding $CARGO_TARGET_DIR with the dependencies built in $seed"
    mkdir -p "$CARGO_TARGET_DIR/debug"
    own_crates=$(find "$top" -maxdepth 2 -name '*.rs' -path '*/tests/*' -printf '%f\n' | sed 's/\.rs$//')
    own_crates="$own_crates etcd_steward etcd_steward_harness etcd_steward_bench harness"
    for part in build deps .fingerprint; do
        [ -d "$seed/$part" ] || continue
        mkdir -p "$CARGO_TARGET_DIR/debug/$part"
        find "$seed/$part" -mindepth 1 -maxdepth 1 -printf '%f\n' | while read -r f; do
            base=${f%%.*}
            base=${base#lib}
            base=${base%-*}
            base=${base//-/_}
            case " $(echo $own_crates) " in *" $base "*) continue ;; esac
            cp -a --reflink=auto "$seed/$part/$f" "$CARGO_TARGET_DIR/debug/$part/"
        done
    done
fi

patches() {
    local p n
    for p in "$shared"/*.patch "$own"/*.patch; do
        [ -f "$p" ] || continue
        basename "$p" .patch
    done | sort -u
}

patch_file() {
    if [ -f "$own/$1.patch" ]; then echo "$own/$1.patch"; else echo "$shared/$1.patch"; fi
}

# The selectors of a patch: `cargo test` arguments, separated by ` | ` in the table.
selectors() {
    awk -F '\t' -v n="$1" '$1 == n { print $2 }' "$table" | sed 's/ | /\n/g' | sed '/^$/d'
}

# Lays the checkout's files (tracked and new, not ignored) out in the scratch tree.
fresh_tree() {
    rm -rf "$tree"
    mkdir -p "$tree"
    git ls-files -z --cached --others --exclude-standard \
        | (cd "$top" && xargs -0 cp --parents -a -t "$tree" 2>/dev/null || true)
    # Files deleted in the work tree but still tracked are skipped by cp; the etcd binaries
    # (.tools/) are ignored by git and shared.
    ln -sfn "$top/.tools" "$tree/.tools"
}

# Runs one selector in the scratch tree; prints "pass", "fail" (a test failed) or
# "error" (no test ran, or the run failed without a failed test).
run_selector() {
    local sel="$1" log="$2"
    local status=0
    # shellcheck disable=SC2086
    (cd "$tree" && cargo test --locked $sel) >"$log" 2>&1 || status=$?
    if [ "$status" -eq 0 ]; then
        if grep -qE '^test result: ok\. [1-9][0-9]* passed' "$log"; then echo pass; else echo error; fi
    elif grep -qE '^test .* \.\.\. FAILED|^test result: FAILED' "$log"; then
        echo fail
    else
        echo error
    fi
}

names=$(patches)
[ -n "$only" ] && names=$(echo "$names" | grep -x -- "$only" || true)
[ -n "$names" ] || { echo "no mutation named ${only:-any} in $shared or $own" >&2; exit 64; }

missing=()
for n in $names; do
    [ -n "$(selectors "$n")" ] || missing+=("$n")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "scripts/mutants.tsv names no test for: ${missing[*]} (a mutant no test is asked to kill survives)" >&2
fi

if [ "$baseline" -eq 1 ]; then
    echo "=== baseline: every named test on the unpatched tree"
    fresh_tree
    bad=0
    for n in $names; do
        i=0
        while IFS= read -r sel; do
            i=$((i + 1))
            r=$(run_selector "$sel" "$logs/baseline-$n-$i.log")
            echo "  $n: cargo test $sel -> $r"
            [ "$r" = pass ] || bad=1
        done < <(selectors "$n")
    done
    if [ "$bad" -ne 0 ]; then
        echo "the baseline does not pass: a mutant 'killed' by a test that fails anyway proves nothing (logs in $logs)" >&2
        exit 1
    fi
fi

commit=$(git rev-parse --short HEAD)
dirty=""
[ -z "$(git status --porcelain --untracked-files=no)" ] || dirty=" (with uncommitted changes)"
report="$work/report.md"
{
    echo "Mutation run at $commit$dirty, $(date -u +%Y-%m-%d), $runs run(s) per test:"
    echo
    echo "| mutation | tests asked (cargo test …) | result | time |"
    echo "|---|---|---|---|"
} >"$report"
survived=0
for n in $names; do
    p=$(patch_file "$n")
    echo "=== $n ($p)"
    fresh_tree
    start=$(date +%s)
    if ! (cd "$tree" && git apply "$p") >"$logs/$n-apply.log" 2>&1; then
        result="does not apply: refresh it in tests/mutations/ ($(head -n1 "$logs/$n-apply.log"))"
        survived=$((survived + 1))
    elif [ -z "$(selectors "$n")" ]; then
        result="SURVIVED: no test named"
        survived=$((survived + 1))
    else
        killed_by=""
        flaky_in=""
        errors=""
        i=0
        while IFS= read -r sel; do
            i=$((i + 1))
            fails=0
            for r in $(seq 1 "$runs"); do
                res=$(run_selector "$sel" "$logs/$n-$i-run$r.log")
                echo "  cargo test $sel, run $r: $res"
                case "$res" in
                    fail) fails=$((fails + 1)) ;;
                    error) errors="$errors ${sel%% --*}" ; break ;;
                esac
            done
            if [ "$fails" -eq "$runs" ]; then
                killed_by="$killed_by \`$sel\`"
            elif [ "$fails" -gt 0 ]; then
                flaky_in="$flaky_in \`$sel\` ($fails of $runs)"
            fi
        done < <(selectors "$n")
        if [ -n "$killed_by" ]; then
            result="KILLED by$killed_by"
        elif [ -n "$flaky_in" ]; then
            result="SURVIVED (FLAKY only:$flaky_in)"
            survived=$((survived + 1))
        elif [ -n "$errors" ]; then
            result="SURVIVED (did not build or ran no test:$errors; see $logs/$n-*.log)"
            survived=$((survived + 1))
        else
            result="SURVIVED"
            survived=$((survived + 1))
        fi
    fi
    secs=$(($(date +%s) - start))
    echo "  -> $result (${secs}s)"
    sels=$(selectors "$n" | sed 's/^/`/; s/$/`/' | paste -sd ';' | sed 's/;/; /g')
    echo "| $n | $sels | $result | ${secs} s |" >>"$report"
done
echo
cat "$report"
[ "$survived" -eq 0 ]
