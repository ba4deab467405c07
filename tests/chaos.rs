//! Randomized fault schedules (`harness::chaos`) on loopback pods running real etcd under a
//! steady writer: overlapping pod kills, sidecar kills, paused etcds, withdrawn DNS names,
//! one lost volume, restarts of every pod, pods cut from their peers, full disks, with
//! backups taken and (in half the schedules) defragmentations running meanwhile; then
//! everything healed and checked — no acknowledged write lost (linearizable reads through
//! every member), one cluster ID, no member ID reused after a volume loss, no data directory
//! deleted (only set aside), no member serving a value never written, every pod back as a
//! ready voter, writes refused no longer than the faults explain, every backup that
//! succeeded verified and one after healing succeeding.
//!
//! The fixed seeds run in CI. `open_ended_schedules_append_to_the_results_file` runs as many
//! schedules as asked and appends one line per schedule to `chaos-results.tsv` (see
//! RELIABILITY.md):
//!
//! ```text
//! CHAOS_SCHEDULES=20 cargo test --release --test chaos -- --ignored --nocapture open_ended
//! ```
//!
//! A failing seed is replayed with `CHAOS_SEEDS=<seed> …` and, once fixed, joins `FIXED_SEEDS`.
//!
//! Generator 3 (`CHAOS_GENERATOR=3 …`, loopback only) ends each schedule with one disaster
//! (`harness::disaster`): every volume lost after a verified backup, or a majority lost for
//! good with every pod down and recovered from the survivor (`recover --yes` or the sidecars'
//! `--auto-recover-after`). Its fixed seeds are `FIXED_DISASTER_SEEDS`.
//!
//! Generator 5 (`CHAOS_GENERATOR=5 …`, loopback only) adds to each schedule one value
//! corrupted on a pod's disk, which the agent must find and rebuild from the peers: no member
//! serves a value never written afterwards (checked in every schedule). Its fixed seed is
//! `FIXED_CORRUPT_SEED`.
//!
//! Generator 6 (`CHAOS_GENERATOR=6 …`, loopback only, etcd 3.5) plays generator 2's faults
//! with Kubernetes' own API server as the writer (`harness::kube_writer`: objects, Leases
//! renewed as controllers do, Events with their one-hour leases, a reflector-like watcher)
//! and checks through it what it acknowledged. Its fixed seed is `FIXED_KUBE_SEED`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::time::Duration;

use harness::chaos::{self, Schedule, Writes};
use harness::kube_apiserver::{EtcdAccess, KubeApiServer};
use harness::loopback::Set;
use harness::wal_kept::WalRecords;
use harness::Etcd;

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const WAIT: Duration = Duration::from_secs(60);
const FAULTS: usize = 7;
const RESULTS_HEADER: &str =
    "# seed\tfaults\tacknowledged\tlost\tlongest_refusal_ms\tcluster_ids\tverdict\tetcd\tgenerator\tunexplained_refusal_ms\n";
/// The generation of `Schedule::generate` (1: no partitions, full disks, backups or
/// defragmentation; lines without the column). A seed replays its schedule only under the
/// generator that wrote its line.
const GENERATOR: u32 = 2;
const SPAN: Duration = Duration::from_secs(20);
/// The generation of `Schedule::generate_disaster`: generator 2's faults (fewer, over a
/// shorter span), then one disaster. Its lines are counted apart in the figure.
const DISASTER_GENERATOR: u32 = 3;
/// Generator 3 with a third disaster: every volume lost, the pods started with a backup
/// key that opens no snapshot, then with the right one. Counted apart in the figure too.
const KEY_GENERATOR: u32 = 4;
const DISASTER_FAULTS: usize = 3;
const DISASTER_SPAN: Duration = Duration::from_secs(8);
/// The generation of `Schedule::generate_corrupt`: generator 2's faults (as few, over as
/// short a span as generator 3's), and one value corrupted on a pod's disk, healed by the
/// agent (the sidecars check the members' hashes every second). Counted apart in the figure.
const CORRUPT_GENERATOR: u32 = 5;

/// A generator-5 seed CI replays on etcd 3.5 (latest).
const FIXED_CORRUPT_SEED: u64 = 3;

/// The generation of the schedules written by Kubernetes' own API server
/// (`harness::kube_writer`): generator 2's faults, with the test API server (the three pods
/// as its `--etcd-servers`, its watch cache on) as the writer — Pods created, Leases renewed
/// as controllers do, Events with their leases, a watcher re-watching and re-listing as
/// client-go's reflector does — and what it acknowledged read back through it after
/// healing. On etcd 3.5 releases alone (Kubernetes 1.36 supports no older). Counted apart
/// in the figure.
const KUBE_GENERATOR: u32 = 6;

/// A generator-6 seed CI replays.
const FIXED_KUBE_SEED: (u64, Etcd) = (1, Etcd::V3_5Current);

/// Generator-3 seeds CI replays, each on one release: every volume lost, on etcd 3.5.30,
/// whose etcdutl jumps the revision (so the restore is checked for a revision that goes
/// backwards); a majority lost and `recover --yes`, and a majority lost and the sidecars'
/// own recovery, on 3.5.1 (`ETCD_3_5_BIN` runs those on another release).
const FIXED_DISASTER_SEEDS: &[(u64, Etcd)] =
    &[(2, Etcd::V3_5Current), (12, Etcd::V3_5), (13, Etcd::V3_5)];

/// A generator-4 seed CI replays on etcd 3.5.1: the wrong key first.
const FIXED_KEY_SEED: u64 = 1;

/// Seeds CI replays, each against one etcd release (every release sees some).
const FIXED_SEEDS: &[(u64, Etcd)] = &[
    (1, Etcd::V3_5Current),
    (2, Etcd::V3_4),
    (3, Etcd::V3_5),
    (4, Etcd::V3_5Current),
    (8, Etcd::V3_4),
];

/// Plays the schedule of `seed`; the outcome, and what the checker found wrong said with
/// the schedule and the pods' logs.
async fn one_schedule(seed: u64, etcd: Etcd) -> (chaos::Outcome, Option<String>) {
    play(Schedule::generate(seed, 3, FAULTS, SPAN), etcd).await
}

/// The schedule of `generator` from `seed`.
fn schedule_of(generator: u32, seed: u64) -> Schedule {
    match generator {
        DISASTER_GENERATOR => Schedule::generate_disaster(seed, 3, DISASTER_FAULTS, DISASTER_SPAN),
        KEY_GENERATOR => {
            Schedule::generate_disaster_with_keys(seed, 3, DISASTER_FAULTS, DISASTER_SPAN)
        }
        CORRUPT_GENERATOR => Schedule::generate_corrupt(seed, 3, DISASTER_FAULTS, DISASTER_SPAN),
        // KUBE_GENERATOR: generator 2's faults, another writer.
        _ => Schedule::generate(seed, 3, FAULTS, SPAN),
    }
}

/// Plays `schedule` on a new set of `etcd`; as [`one_schedule`].
async fn play(schedule: Schedule, etcd: Etcd) -> (chaos::Outcome, Option<String>) {
    play_writing(schedule, etcd, false).await
}

/// [`play`], written (`kube`) by the test API server on the set rather than by the etcd
/// writer.
async fn play_writing(
    schedule: Schedule,
    etcd: Etcd,
    kube: bool,
) -> (chaos::Outcome, Option<String>) {
    let seed = schedule.seed;
    eprintln!("{schedule}");
    let mut set = Set::new(STEWARD, etcd, 3).await.unwrap();
    chaos::prepare(&mut set, &schedule).unwrap();
    set.start_all(WAIT).await.unwrap();
    set.wait_ready(&[0, 1, 2], 3, WAIT).await.unwrap();
    let api = match kube {
        true => {
            let servers = (0..3).map(|o| set.client_url(o)).collect();
            let access = EtcdAccess { servers, tls: None };
            let api = KubeApiServer::start(&access).await.unwrap();
            api.wait_ready(WAIT).await.unwrap();
            Some(api)
        }
        false => None,
    };
    let writes = match &api {
        Some(api) => Writes::Kube(api),
        None => Writes::Etcd,
    };
    let outcome = chaos::run_writing(&mut set, &schedule, writes).await;
    let violations = outcome.violations();
    let failure = (!violations.is_empty()).then(|| {
        let api_log = api
            .as_ref()
            .map(|a| format!("\nthe API server's log:\n{}", a.log()))
            .unwrap_or_default();
        format!(
            "seed {seed} on {etcd:?}: {violations:#?}\n{schedule}\n{outcome:?}\n{}{api_log}",
            set.dump()
        )
    });
    if let Some(api) = api {
        api.stop().await;
    }
    set.shutdown().await;
    (outcome, failure)
}

/// The disaster checks decide from the release under test whether a restore must jump the
/// revision, never from a `--help` text: the rule agrees with what each offline tool here
/// can do (etcdutl 3.5.30 jumps; 3.5.1's etcdutl and 3.4.23's etcdctl do not).
#[test]
fn the_revision_jump_is_expected_exactly_from_the_releases_whose_tool_can_make_it() {
    let mut expected = Vec::new();
    for etcd in [Etcd::V3_5Current, Etcd::V3_5, Etcd::V3_4] {
        let release = harness::etcd::release(&etcd.bin());
        let rule = harness::etcd::release_can_jump(release);
        assert_eq!(
            rule,
            harness::etcd::tool_can_jump(&etcd.offline_tool()),
            "{etcd:?} is {release:?}"
        );
        expected.push(rule);
    }
    // CI's disaster seeds restore on a release that jumps.
    assert!(expected[0], "etcd 3.5.30's restore jumps the revision");
    assert!(FIXED_DISASTER_SEEDS
        .iter()
        .any(|(seed, etcd)| *etcd == Etcd::V3_5Current
            && schedule_of(DISASTER_GENERATOR, *seed)
                .disaster
                .is_some_and(|d| d.restores())));
}

/// The partition fault itself: a cut pod loses its peers (no leader, no linearizable read)
/// while a client still reaches it (a serializable read answers), the others keep a quorum,
/// and healing joins it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_pod_loses_its_peers_but_not_its_clients_and_rejoins_when_healed() {
    let mut set = Set::new(STEWARD, Etcd::V3_5Current, 3).await.unwrap();
    set.enable_partitions().unwrap();
    set.start_all(WAIT).await.unwrap();
    set.wait_ready(&[0, 1, 2], 3, WAIT).await.unwrap();
    let cut = set.leader().await.unwrap();
    set.partition(cut, true).unwrap();
    let others = [(cut + 1) % 3, (cut + 2) % 3];
    harness::wait_for_or(
        WAIT,
        &format!("pod {cut} cut off: no linearizable read through it, the others keeping quorum"),
        || async { !set.linearizable_ok(cut).await && set.all_linearizable(&others, 3).await },
        || set.dump(),
    )
    .await;
    let mut c = set.client(cut).await.unwrap();
    let serializable = etcd_client::GetOptions::new().with_serializable();
    c.get("any", Some(serializable))
        .await
        .expect("a client still reaches the cut pod");
    set.partition(cut, false).unwrap();
    set.wait_ready(&[0, 1, 2], 3, WAIT).await.unwrap();
    harness::wait_for_or(
        WAIT,
        &format!("pod {cut} rejoined once healed"),
        || set.all_linearizable(&[0, 1, 2], 3),
        || set.dump(),
    )
    .await;
    set.shutdown().await;
}

/// The checker's "no data deleted, only set aside" against the agent itself: the fixed seeds
/// set nothing aside (a lost volume is emptied, not set aside), so a removed member's volume
/// is: `init` moves its data under `set-aside/` and joins anew, and every WAL segment recorded
/// before must be found there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_members_wal_set_aside_by_init_is_found_whole_by_the_checker() {
    let mut set = Set::new(STEWARD, Etcd::V3_5Current, 3).await.unwrap();
    set.start_all(WAIT).await.unwrap();
    set.wait_ready(&[0, 1, 2], 3, WAIT).await.unwrap();
    set.put_keys("k", 100).await.unwrap();
    let old = set.member_id(2).await.unwrap();
    set.kill(2).await.unwrap();
    let mut wals = WalRecords::default();
    wals.record(2, set.data_dir(2));
    assert_eq!(wals.count(), 1, "pod 2's WAL was recorded");
    harness::wait_for(WAIT, "etcd-2's member removed", || async {
        let mut admin = set.client(0).await.unwrap();
        admin.member_remove(old).await.is_ok()
    })
    .await;
    set.start(2).unwrap();
    set.wait_ready(&[0, 1, 2], 3, WAIT).await.unwrap();
    let aside = std::fs::read_dir(set.data_dir(2).join("set-aside"))
        .map(|d| d.count())
        .unwrap_or(0);
    let missing = wals.missing(|o| set.data_dir(o).to_path_buf());
    let dump = set.dump();
    set.shutdown().await;
    assert_eq!(aside, 1, "init set the removed member's data aside\n{dump}");
    assert!(missing.is_empty(), "{missing:?}\n{dump}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_seeds_lose_no_acknowledged_write_and_split_no_cluster() {
    // What the figure says happens during the faults must have happened in the fixed set:
    // defragmentations in the schedules that defragment, backups that succeed meanwhile.
    let mut defrags = 0;
    let mut backups_ok_during_faults = 0;
    for (seed, etcd) in FIXED_SEEDS {
        let (o, failure) = one_schedule(*seed, *etcd).await;
        if Schedule::generate(*seed, 3, FAULTS, SPAN).defrag {
            defrags += o.defrags;
        }
        backups_ok_during_faults += o
            .backups
            .iter()
            .filter(|b| !b.after_healing && b.exited_ok && b.verified)
            .count();
        if let Some(f) = failure {
            panic!("{f}");
        }
        assert!(o.writes.acked > 0, "seed {seed}: the writer wrote");
        assert!(
            o.faults >= FAULTS - 1,
            "seed {seed}: the faults were applied"
        );
        assert!(
            o.sentinels >= 3,
            "seed {seed}: every live data directory got a sentinel"
        );
        // At most one volume is lost per schedule: its records are exempt.
        assert!(
            o.wal_records >= 2,
            "seed {seed}: the WAL of every pod whose volume was kept was recorded before the faults"
        );
        let u = o.unexplained();
        eprintln!(
            "seed {seed} on {etcd:?}: {} (longest unexplained refusal {:?}, of the refusal from {:?} to {:?}; {} sentinels and {} WAL records checked, {} ENOSPC log lines, {} defragmentations, backups {:?})",
            o.tsv_line(),
            u.length,
            u.refusal.0,
            u.refusal.1,
            o.sentinels,
            o.wal_records,
            o.enospc_lines,
            o.defrags,
            o.backups
                .iter()
                .map(|b| (b.pod, b.exited_ok, b.verified, b.error.as_str()))
                .collect::<Vec<_>>()
        );
    }
    assert!(
        defrags > 0,
        "no member was defragmented in the fixed schedules that defragment"
    );
    assert!(
        backups_ok_during_faults > 0,
        "no backup taken during the faults of the fixed schedules succeeded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_disaster_seeds_lose_no_acknowledged_write() {
    let mut struck = Vec::new();
    let mut jump_checked = false;
    for (seed, etcd) in FIXED_DISASTER_SEEDS {
        let started = std::time::Instant::now();
        let (o, failure) = play(schedule_of(DISASTER_GENERATOR, *seed), *etcd).await;
        if let Some(f) = failure {
            panic!("{f}");
        }
        let d = o.disaster.as_ref().expect("the disaster struck");
        assert!(
            d.acked_before > 0 && o.writes.acked > d.acked_before,
            "seed {seed}: writes acknowledged before the disaster and after it"
        );
        eprintln!(
            "seed {seed} on {etcd:?} ({}): {} in {:?}; {} writes before it, {} had to survive; backups {:?}; recoveries {:?}; HashKV {:x?} at revision {}; revision jump checked: {}",
            d.disaster,
            o.tsv_line(),
            started.elapsed(),
            d.acked_before,
            d.must_hold(&o.writes),
            d.backups,
            d.recoveries,
            d.hashes,
            d.hash_revision,
            d.bump_checked
        );
        jump_checked |= d.disaster.restores() && d.bump_checked;
        struck.push(d.disaster.clone());
    }
    assert!(
        jump_checked,
        "no fixed disaster seed restored on a release whose restore jumps the revision: the revision was never checked"
    );
    use harness::disaster::Disaster;
    assert!(
        struck.contains(&Disaster::LoseEveryVolume)
            && struck.iter().any(|d| matches!(
                d,
                Disaster::LoseMajority {
                    recover_in: Some(_),
                    ..
                }
            ))
            && struck.iter().any(|d| matches!(
                d,
                Disaster::LoseMajority {
                    recover_in: None,
                    ..
                }
            )),
        "the fixed disaster seeds cover every disaster: {struck:?}"
    );
}

/// Every volume lost after an encrypted backup; the pods started with a key that opens no
/// snapshot wait, each saying why on `/ready`, and form nothing; started with the right key
/// on the same volumes they come back from the newest backup, with every write it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_seed_with_the_wrong_backup_key_first_waits_then_restores_with_the_right_one() {
    let (o, failure) = play(schedule_of(KEY_GENERATOR, FIXED_KEY_SEED), Etcd::V3_5).await;
    if let Some(f) = failure {
        panic!("{f}");
    }
    let d = o.disaster.as_ref().expect("the disaster struck");
    assert_eq!(d.disaster, harness::disaster::Disaster::WrongKeyThenRight);
    assert!(
        d.wrong_key.len() == 3 && d.wrong_key.iter().all(|w| w.said_why && !w.formed),
        "every pod waited with the wrong key: {:?}",
        d.wrong_key
    );
    assert!(
        d.must_hold(&o.writes) > 0 && o.writes.acked > d.acked_before,
        "writes the backup held had to come back, and writes went on after: {}",
        o.tsv_line()
    );
    eprintln!(
        "seed {FIXED_KEY_SEED} ({}): {}; {} writes before it, {} had to survive; backups {:?}",
        d.disaster,
        o.tsv_line(),
        d.acked_before,
        d.must_hold(&o.writes),
        d.backups
    );
}

/// A value corrupted on one pod's disk while its etcd is down (bbolt has no page checksums:
/// etcd serves it once started again); the runner never mends it. The agent finds the member
/// diverged and rebuilds it from its peers: afterwards no member serves a value never
/// written, the pod is another member (its data set aside as diverged), and nothing else
/// the checker holds a run to is broken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_seed_with_a_value_corrupted_on_disk_is_healed_by_the_agent() {
    let started = std::time::Instant::now();
    let (o, failure) = play(
        schedule_of(CORRUPT_GENERATOR, FIXED_CORRUPT_SEED),
        Etcd::V3_5Current,
    )
    .await;
    if let Some(f) = failure {
        panic!("{f}");
    }
    let (pod, write) = o.corrupted.expect("a value was corrupted");
    assert!(write.is_some(), "the runner found a value to corrupt");
    assert_eq!(
        o.rebuilt,
        Some(pod),
        "the agent rebuilt the corrupted member"
    );
    eprintln!(
        "seed {FIXED_CORRUPT_SEED}: {} in {:?}; the value of write {write:?} corrupted on pod {pod}, every pod serving written values alone {:?} after; its etcd stopped during the rebuild at {:?}; longest unexplained refusal {:?}",
        o.tsv_line(),
        started.elapsed(),
        o.healed_after,
        o.rebuild_stops,
        o.unexplained()
    );
}

/// Generator 6's fixed seed: generator 2's faults (pods killed, a volume lost, etcds paused,
/// pods cut off, full disks, backups) with Kubernetes' own API server as the writer; after
/// healing, everything it acknowledged is served through it (a consistent list, the watch
/// cache, a watcher that re-watched and re-listed), no resource version went backwards, every
/// Lease holds its last acknowledged renewal, every acknowledged Event is served, and every
/// member holds every acknowledged object (linearizable reads of its etcd keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_seed_written_by_the_api_server_loses_nothing_it_acknowledged() {
    let (seed, etcd) = FIXED_KUBE_SEED;
    let started = std::time::Instant::now();
    let (o, failure) = play_writing(schedule_of(KUBE_GENERATOR, seed), etcd, true).await;
    if let Some(f) = failure {
        panic!("{f}");
    }
    let k = o.kube.as_ref().expect("the API server wrote");
    assert!(
        k.acked > 0 && k.events_acked > 0 && k.watches > 0,
        "objects and Events acknowledged, and watched: {k:?}"
    );
    assert!(
        k.leases.iter().all(|l| l.renewals > 1),
        "every Lease renewed: {:?}",
        k.leases
    );
    assert!(o.faults >= FAULTS - 1, "the faults were applied");
    eprintln!(
        "seed {seed} on {etcd:?} written by the API server: {} in {:?}; {} objects, {} Events, Lease renewals {:?}; the watcher listed {} times, watched {} times, was told 410 {} times; failed requests {:?}; longest unexplained refusal {:?}",
        o.tsv_line(),
        started.elapsed(),
        k.acked,
        k.events_acked,
        k.leases.iter().map(|l| l.renewals).collect::<Vec<_>>(),
        k.watch_lists,
        k.watches,
        k.watch_gone,
        k.failed,
        o.unexplained()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "open-ended: CHAOS_SCHEDULES=N (or CHAOS_SEEDS=a,b,…) appends to chaos-results.tsv"]
async fn open_ended_schedules_append_to_the_results_file() {
    let seeds: Vec<u64> = match std::env::var("CHAOS_SEEDS") {
        Ok(list) => list.split(',').map(|s| s.trim().parse().unwrap()).collect(),
        Err(_) => {
            let n: u64 = std::env::var("CHAOS_SCHEDULES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(5);
            let base = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
                << 8;
            (0..n).map(|i| base + i).collect()
        }
    };
    let generator: u32 = std::env::var("CHAOS_GENERATOR")
        .ok()
        .and_then(|g| g.parse().ok())
        .unwrap_or(GENERATOR);
    assert!(
        [
            GENERATOR,
            DISASTER_GENERATOR,
            KEY_GENERATOR,
            CORRUPT_GENERATOR,
            KUBE_GENERATOR
        ]
        .contains(&generator),
        "CHAOS_GENERATOR must be {GENERATOR}, {DISASTER_GENERATOR}, {KEY_GENERATOR}, {CORRUPT_GENERATOR} or {KUBE_GENERATOR}"
    );
    let releases = [Etcd::V3_5Current, Etcd::V3_4, Etcd::V3_5];
    let kube = generator == KUBE_GENERATOR;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/chaos-results.tsv");
    for seed in seeds {
        let etcd = match kube {
            // Kubernetes 1.36 supports etcd 3.5 and later.
            true => [Etcd::V3_5Current, Etcd::V3_5][(seed % 2) as usize],
            false => releases[(seed % 3) as usize],
        };
        let (o, failure) = play_writing(schedule_of(generator, seed), etcd, kube).await;
        if !std::path::Path::new(path).exists() {
            std::fs::write(path, RESULTS_HEADER).unwrap();
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        // The longest unexplained refusal last: lines written before it have 9 columns.
        writeln!(
            f,
            "{}\t{etcd:?}\t{generator}\t{}",
            o.tsv_line(),
            o.unexplained().length.as_millis()
        )
        .unwrap();
        if let Some(failure) = failure {
            panic!("{failure}");
        }
    }
}
