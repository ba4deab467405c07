//! Every volume lost, with the archive continuing the newest snapshot: the cluster comes back
//! from the snapshot with every archived revision replayed onto it, each key at its original
//! `mod_revision`, leased keys on leases with their TTLs, and the revision moved past every
//! one served (where the tool can jump it). Real etcd 3.5.30 (and 3.5.1, 3.4.23 for the
//! whole restore), dnsmasq, `init`, `sidecar` and `backup` processes on
//! loopback, a `file://` store; the segments are made from the cluster's own watch
//! (`support/archive.rs`), as the sidecar's archiver writes them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/archive.rs"]
mod archive;

use std::path::Path;
use std::time::Duration;

use etcd_client::{Client, GetOptions, PutOptions};
use etcd_steward::backup::store::Store;
use harness::loopback::{first_snapshot, BackedSet, Backups, Set};
use harness::{wait_for, Etcd};

const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");
const FORM: Duration = Duration::from_secs(60);

/// A three-pod set formed with backups in `store`, `--restore latest`.
async fn formed(etcd: Etcd, store: &Path) -> BackedSet {
    formed_with(etcd, store, &[]).await
}

/// [`formed`], with `more` options for every pod.
async fn formed_with(etcd: Etcd, store: &Path, more: &[&str]) -> BackedSet {
    let backups = Backups::file(store)
        .with(["--backup-interval=1h", "--restore=latest"])
        .with(more.iter().copied());
    let set = BackedSet::form(STEWARD, etcd, 3, &backups, FORM)
        .await
        .unwrap();
    first_snapshot(store, FORM).await;
    set
}

/// `etcd-steward backup` through pod `o`'s member: its manifest.
async fn backup_now(set: &Set, o: u32) -> serde_json::Value {
    let out = tokio::process::Command::new(STEWARD)
        .arg("backup")
        .args(set.common_args(o))
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "backup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// (key, value, create_revision, mod_revision, version, lease) of every key under the
/// prefixes the test writes.
type Kv = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

async fn written_keys(c: &mut Client, at: Option<i64>) -> Vec<Kv> {
    let mut out = Vec::new();
    for prefix in ["k/", "leased/", "late/"] {
        let mut options = GetOptions::new().with_prefix();
        if let Some(r) = at {
            options = options.with_revision(r);
        }
        let r = c.get(prefix, Some(options)).await.unwrap();
        out.extend(r.kvs().iter().map(|kv| {
            (
                kv.key().to_vec(),
                kv.value().to_vec(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.lease(),
            )
        }));
    }
    out
}

async fn every_volume_lost_comes_back_with_every_archived_write_at_its_revision(etcd: Etcd) {
    let store_dir = tempfile::tempdir().unwrap();
    let mut set = formed(etcd, store_dir.path()).await;
    set.put_keys("k", 20).await.unwrap();
    let snapshot = backup_now(&set, 0).await;
    let (name, from) = (
        snapshot["name"].as_str().unwrap().to_string(),
        snapshot["revision"].as_i64().unwrap(),
    );
    // Written after the newest snapshot: only the archive has them.
    let mut c = set.client(0).await.unwrap();
    let lease = c.lease_grant(90, None).await.unwrap().id();
    let leased = Some(PutOptions::new().with_lease(lease));
    c.put("leased/a", "a", leased.clone()).await.unwrap();
    c.put("k/1", "overwritten", None).await.unwrap();
    c.put("leased/b", "b", leased).await.unwrap();
    c.delete("k/2", None).await.unwrap();
    for i in 0..5 {
        c.put(format!("late/{i}"), vec![b'x'; 1024], None)
            .await
            .unwrap();
    }
    let last = c.status().await.unwrap().header().unwrap().revision();
    let expected = written_keys(&mut c, None).await;
    let cluster = set.cluster_id(0).await.unwrap();
    let store = Store::open(&format!("file://{}", store_dir.path().display())).unwrap();
    let segments = archive::archive(&mut c, &store, cluster, from + 1, last, 4, |_| {
        u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap()
    })
    .await;
    assert!(segments.len() >= 2, "{segments:?}");
    let mut served = 0;
    for o in 0..3 {
        served = served.max(set.revision(o).await.unwrap());
    }
    // What a read at each archived revision answered before the loss.
    let mut history = Vec::new();
    for r in from..=last {
        history.push((r, written_keys(&mut c, Some(r)).await));
    }
    drop(c);

    for o in 0..3 {
        set.kill(o).await.unwrap();
        set.wipe(o).unwrap();
    }
    for o in 0..3 {
        set.start(o).unwrap();
    }
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    let jumps = harness::etcd::tool_can_jump(&etcd.offline_tool());
    for o in 0..3 {
        if jumps {
            old_revisions_are_compacted_and_new_writes_above(&set, o, served).await;
        } else {
            old_revisions_read_as_before(&set, o, &history).await;
        }
    }
    let point = format!("{name}+r{last}");
    for o in 0..3 {
        let mut c = set.client(o).await.unwrap();
        let got = written_keys(&mut c, None).await;
        assert_eq!(got, expected, "pod {o}: every key at its original revision");
        for kv in got.iter().filter(|kv| kv.0.starts_with(b"leased/")) {
            assert_eq!(kv.5, lease, "pod {o}: {:?} keeps its lease", kv.0);
            let ttl = c.lease_time_to_live(kv.5, None).await.unwrap();
            assert_eq!(ttl.granted_ttl(), 90, "pod {o}: the lease's TTL");
            assert!(ttl.ttl() > 0, "pod {o}: the lease is alive");
        }
        let now = set.revision(o).await.unwrap();
        let logs = set.logs(o);
        if jumps {
            assert!(
                now > served,
                "pod {o}: revision {now} is above the {served} served before the loss"
            );
            // The jump marks every earlier revision compacted: the file keeps each
            // key's last write only.
            assert!(
                logs.contains(r#""history":"latest""#),
                "pod {o} wrote each key's last write:\n{}",
                set.dump()
            );
        } else {
            // etcd 3.4's etcdctl and etcdutl 3.5.1 cannot jump (refused at start unless
            // --restore-bump-revision 0 says so): the revision is the last one replayed.
            assert_eq!(now, last, "pod {o}: the revision is the last archived one");
            assert!(
                logs.contains(r#""history":"full""#),
                "pod {o} kept the whole history:\n{}",
                set.dump()
            );
        }
        assert!(
            logs.contains("archive replayed onto the snapshot") && logs.contains(&point),
            "pod {o} says what it replayed and restored:\n{}",
            set.dump()
        );
        assert!(
            logs.contains(r#""method":"file""#),
            "pod {o} wrote the replay into the snapshot's file, not through etcd's API:\n{}",
            set.dump()
        );
    }
    set.shutdown().await;
}

/// A read through pod `o` of every key at `revision`: what etcd answered, or its refusal.
async fn read_at(set: &Set, o: u32, revision: i64) -> Result<usize, String> {
    let mut c = set.client(o).await.unwrap();
    let opts = GetOptions::new().with_all_keys().with_revision(revision);
    match c.get("", Some(opts)).await {
        Ok(r) => Ok(r.kvs().len()),
        Err(e) => Err(e.to_string()),
    }
}

/// After a restore that jumps the revision, judged from etcd: pod `o`'s revision is above
/// every one `served` before the loss; a read at any revision up to `served` is refused as
/// compacted (never answered with other data than was served at it); a watch from an old
/// revision is cancelled as compacted (its watchers re-list); and a new write gets a
/// revision above every one served before.
async fn old_revisions_are_compacted_and_new_writes_above(set: &Set, o: u32, served: i64) {
    for r in 1..=served {
        match read_at(set, o, r).await {
            Err(e) if e.contains("required revision has been compacted") => {}
            Err(e) => panic!("pod {o}: a read at revision {r} failed, not as compacted: {e}"),
            Ok(n) => panic!(
                "pod {o}: a read at revision {r} (at or below the {served} served before the loss) was answered with {n} keys, not refused as compacted"
            ),
        }
    }
    let now = set.revision(o).await.unwrap();
    assert!(
        now > served,
        "pod {o}: revision {now} is above the {served} served before the loss"
    );
    for r in [1, served] {
        let (_, watch) = set.compacted_at(o, r).await.unwrap();
        assert!(
            watch,
            "pod {o}: a watch from revision {r} is cancelled as compacted"
        );
    }
    let mut c = set.client(o).await.unwrap();
    let put = c.put(format!("after/{o}"), "new", None).await.unwrap();
    let at = put.header().unwrap().revision();
    assert!(
        at > served,
        "pod {o}: a write after the restore got revision {at}, not above the {served} served before the loss"
    );
}

/// After a restore that keeps the whole history (no jump): a read through pod `o` at each
/// archived revision answers what it answered before the loss.
async fn old_revisions_read_as_before(set: &Set, o: u32, history: &[(i64, Vec<Kv>)]) {
    let mut c = set.client(o).await.unwrap();
    for (r, before) in history {
        assert_eq!(
            &written_keys(&mut c, Some(*r)).await,
            before,
            "pod {o}: a read at revision {r} answers what it did before the loss"
        );
    }
}

/// The archive's second segment is corrupted after it was stored: every pod's replay ends
/// before it, says so, and the cluster comes back with what was verified (the snapshot and
/// the first segment), not with nothing and not with a hole. The sidecars' own archive is
/// off (`--archive-interval=0`): the test's segments are the only ones in the store, so no
/// undamaged segment of the leader's for the same revisions can stand in for the bad one,
/// and the outcome does not depend on when the leader's archive last ran.
async fn a_corrupted_segment_restores_what_was_verified_before_it(etcd: Etcd) {
    let store_dir = tempfile::tempdir().unwrap();
    let mut set = formed_with(etcd, store_dir.path(), &["--archive-interval=0"]).await;
    set.put_keys("k", 10).await.unwrap();
    let snapshot = backup_now(&set, 0).await;
    let from = snapshot["revision"].as_i64().unwrap();
    let mut c = set.client(0).await.unwrap();
    for i in 0..8 {
        c.put(format!("late/{i}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    let last = c.status().await.unwrap().header().unwrap().revision();
    let cluster = set.cluster_id(0).await.unwrap();
    let store = Store::open(&format!("file://{}", store_dir.path().display())).unwrap();
    let segments = archive::archive(&mut c, &store, cluster, from + 1, last, 3, |r| {
        1_795_000_000_000 + u64::try_from(r).unwrap()
    })
    .await;
    assert!(segments.len() >= 3, "{segments:?}");
    // The premise: the store holds the test's segments and no other (the archive is off).
    let stored = stored_segments(store_dir.path());
    let mut ours: Vec<String> = segments.iter().map(|s| s.seg_object()).collect();
    ours.sort();
    assert_eq!(stored, ours, "the store holds only the test's segments");
    let verified_up_to = segments[0].last_revision;
    let expected = written_keys(&mut c, Some(verified_up_to)).await;
    drop(c);
    let object = store_dir.path().join(segments[1].seg_object());
    let mut bytes = std::fs::read(&object).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    std::fs::write(&object, bytes).unwrap();

    for o in 0..3 {
        set.kill(o).await.unwrap();
        set.wipe(o).unwrap();
    }
    for o in 0..3 {
        set.start(o).unwrap();
    }
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    for o in 0..3 {
        let mut c = set.client(o).await.unwrap();
        assert_eq!(
            written_keys(&mut c, None).await,
            expected,
            "pod {o}: the keyspace up to the last verified revision {verified_up_to}"
        );

        let logs = set.logs(o);
        assert!(
            logs.contains("the archive replay stopped before its target")
                && logs.contains(&segments[1].name),
            "pod {o} says where the replay stopped and which segment is bad:\n{}",
            set.dump()
        );
    }
    set.shutdown().await;
}

/// The segment objects (`.seg`) of the `file://` store at `dir`, relative to it, by name.
fn stored_segments(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "seg") {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// With etcd's authentication on, the snapshot restores with it on: the replay's throw-away
/// etcd is asked with the cluster's credentials, and every archived write still comes back
/// (without them every transaction is refused and no pod ever starts).
async fn every_volume_lost_under_etcd_authentication_comes_back_with_the_archive(etcd: Etcd) {
    let store_dir = tempfile::tempdir().unwrap();
    let mut set = formed(etcd, store_dir.path()).await;
    set.put_keys("k", 10).await.unwrap();
    let mut c = set.client(0).await.unwrap();
    c.user_add("root", "s3cret", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.auth_enable().await.unwrap();
    drop(c);
    let password = set.root().join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    set.extra_args.extend([
        "--auth-username=root".to_string(),
        format!("--auth-password-file={}", password.display()),
    ]);
    let as_root = set
        .client_options(Duration::from_secs(5))
        .with_user("root", "s3cret");
    let mut c = Client::connect([set.client_url(0)], Some(as_root.clone()))
        .await
        .unwrap();
    let snapshot = backup_now(&set, 0).await;
    let (name, from) = (
        snapshot["name"].as_str().unwrap().to_string(),
        snapshot["revision"].as_i64().unwrap(),
    );
    for i in 0..6 {
        c.put(format!("late/{i}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    let last = c.status().await.unwrap().header().unwrap().revision();
    let expected = written_keys(&mut c, None).await;
    let cluster = c.status().await.unwrap().header().unwrap().cluster_id();
    let store = Store::open(&format!("file://{}", store_dir.path().display())).unwrap();
    archive::archive(&mut c, &store, cluster, from + 1, last, 3, |r| {
        1_795_000_000_000 + u64::try_from(r).unwrap()
    })
    .await;
    drop(c);

    for o in 0..3 {
        set.kill(o).await.unwrap();
        set.wipe(o).unwrap();
    }
    for o in 0..3 {
        set.start(o).unwrap();
    }
    // The harness's own wait asks without credentials: ask as root here.
    wait_for(FORM, "every pod ready, three voters listed", || async {
        let Ok(mut c) = Client::connect([set.client_url(0)], Some(as_root.clone())).await else {
            return false;
        };
        set.all_ready(&[0, 1, 2]).await
            && c.member_list()
                .await
                .is_ok_and(|l| l.members().iter().filter(|m| !m.is_learner()).count() == 3)
    })
    .await;
    let point = format!("{name}+r{last}");
    for o in 0..3 {
        let mut c = Client::connect([set.client_url(o)], Some(as_root.clone()))
            .await
            .unwrap();
        assert_eq!(
            written_keys(&mut c, None).await,
            expected,
            "pod {o}: every archived write, restored under authentication"
        );
        assert!(
            set.logs(o).contains(&point),
            "pod {o} restored {point}:\n{}",
            set.dump()
        );
    }
    set.shutdown().await;
}

/// `--restore revision:N`, every volume lost: the cluster comes back as it was at revision N
/// (the snapshot before it and the archive up to N), not at the archive's end.
async fn every_volume_lost_with_restore_revision_comes_back_at_that_revision(etcd: Etcd) {
    let store_dir = tempfile::tempdir().unwrap();
    let mut set = formed(etcd, store_dir.path()).await;
    set.put_keys("k", 10).await.unwrap();
    let snapshot = backup_now(&set, 0).await;
    let from = snapshot["revision"].as_i64().unwrap();
    let mut c = set.client(0).await.unwrap();
    for i in 0..8 {
        c.put(format!("late/{i}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    let last = c.status().await.unwrap().header().unwrap().revision();
    let cluster = set.cluster_id(0).await.unwrap();
    let store = Store::open(&format!("file://{}", store_dir.path().display())).unwrap();
    archive::archive(&mut c, &store, cluster, from + 1, last, 3, |r| {
        1_795_000_000_000 + u64::try_from(r).unwrap()
    })
    .await;
    let moment = from + 4;
    let expected = written_keys(&mut c, Some(moment)).await;
    drop(c);
    for a in set.extra_args.iter_mut() {
        if a.starts_with("--restore=") {
            *a = format!("--restore=revision:{moment}");
        }
    }
    for o in 0..3 {
        set.kill(o).await.unwrap();
        set.wipe(o).unwrap();
    }
    for o in 0..3 {
        set.start(o).unwrap();
    }
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    for o in 0..3 {
        let mut c = set.client(o).await.unwrap();
        assert_eq!(
            written_keys(&mut c, None).await,
            expected,
            "pod {o}: the keyspace at revision {moment}"
        );
    }
    set.shutdown().await;
}

harness::per_etcd_version!(
    [V3_5Current]:
    every_volume_lost_with_restore_revision_comes_back_at_that_revision,
    a_corrupted_segment_restores_what_was_verified_before_it,
    every_volume_lost_under_etcd_authentication_comes_back_with_the_archive,
);

harness::per_etcd_version!(
    [V3_5Current, V3_5, V3_4] by scenario:
    every_volume_lost_comes_back_with_every_archived_write_at_its_revision =>
        every_volume_lost_comes_back_with_every_archived_write_at_its_revision,
);

/// Issue 26's "restoring a 1 GiB snapshot plus one hour of 100 writes/s within 1.2× the
/// snapshot-only restore", on three loopback pods: a set loaded with `RESTORE_LARGE_MIB` MiB
/// (default 1024) of 1 KiB values and its snapshot; every pod stopped; then
/// `RESTORE_LARGE_REVISIONS` (default 360,000) archived revisions continuing it, each a put of
/// 1 KiB over a loaded key. `RESTORE_LARGE_RUNS` (default 2) pairs of runs, alternating which
/// goes first: every volume wiped, every pod started at t0, timed until three voters are
/// `/ready`; once with `--restore revision:<last>` (the snapshot and the archive), once with
/// `--restore <snapshot>` (the snapshot alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_restore_of_a_large_snapshot_with_an_hour_of_archive() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let keys = env("RESTORE_LARGE_MIB", 1024) * 1024;
    let revisions = env("RESTORE_LARGE_REVISIONS", 360_000) as i64;
    let runs = env("RESTORE_LARGE_RUNS", 2);
    let store_dir = tempfile::tempdir().unwrap();
    let mut set = formed(Etcd::V3_5Current, store_dir.path()).await;
    let mut c = set.client(0).await.unwrap();
    let loading = std::time::Instant::now();
    for chunk in 0..keys.div_ceil(128) {
        let ops: Vec<etcd_client::TxnOp> = (chunk * 128..((chunk + 1) * 128).min(keys))
            .map(|i| etcd_client::TxnOp::put(format!("load/{i:08}"), vec![b'l'; 1024], None))
            .collect();
        let txn = etcd_client::Txn::new().and_then(ops);
        let mut tries = 0;
        while let Err(e) = c.txn(txn.clone()).await {
            tries += 1;
            assert!(tries < 5, "loading: {e}");
        }
    }
    println!("loaded {keys} keys in {:.1?}", loading.elapsed());
    let snapshot = backup_now(&set, 0).await;
    let (name, from) = (
        snapshot["name"].as_str().unwrap().to_string(),
        snapshot["revision"].as_i64().unwrap(),
    );
    let cluster = set.cluster_id(0).await.unwrap();
    drop(c);
    for o in 0..3 {
        set.kill(o).await.unwrap();
    }
    let store = Store::open(&format!("file://{}", store_dir.path().display())).unwrap();
    let now_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let revs: Vec<etcd_steward::backup::archive::segment::Revision> = (1..=revisions)
        .map(|i| etcd_steward::backup::archive::segment::Revision {
            revision: from + i,
            time_unix_ms: now_ms,
            ops: vec![etcd_steward::backup::archive::segment::Op::Put {
                key: format!("load/{:08}", (i as u64 * 7919) % keys).into_bytes(),
                value: vec![b'w'; 1024],
                lease: 0,
            }],
        })
        .collect();
    archive::put_segments(&store, cluster, &revs, &Default::default(), 4000).await;
    drop(revs);
    let last = from + revisions;
    let restore = |arg: String| {
        move |set: &mut BackedSet| {
            set.extra_args.retain(|a| !a.starts_with("--restore="));
            set.extra_args.push(arg.clone());
        }
    };
    let with_archive = restore(format!("--restore=revision:{last}"));
    let alone = restore(format!("--restore={name}"));
    for run in 0..runs {
        let mut times = [0.0f64; 2];
        for which in [run % 2, 1 - run % 2] {
            if which == 0 {
                with_archive(&mut set);
            } else {
                alone(&mut set);
            }
            for o in 0..3 {
                set.kill(o).await.unwrap();
                set.wipe(o).unwrap();
            }
            let t0 = std::time::Instant::now();
            for o in 0..3 {
                set.start(o).unwrap();
            }
            set.wait_ready(&[0, 1, 2], 3, Duration::from_secs(900))
                .await
                .unwrap();
            times[which as usize] = t0.elapsed().as_secs_f64();
            // etcd compacts the restored history right after it starts: answers may be slow.
            let mut r = set.revision(0).await;
            for _ in 0..30 {
                if r.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
                r = set.revision(0).await;
            }
            let r = r.unwrap();
            assert!(
                r >= if which == 0 { last } else { from },
                "run {run}: revision {r}"
            );
        }
        println!(
            "restore run {}: snapshot and {revisions} archived revisions {:.2} s, the snapshot alone {:.2} s: {:.2}x",
            run + 1,
            times[0],
            times[1],
            times[0] / times[1]
        );
    }
    let logs = set.logs(0);
    if std::env::var_os("RESTORE_LARGE_LOGS").is_some() {
        println!("pod 0's log:\n{logs}");
    }
    assert!(
        logs.contains(r#""method":"file""#),
        "pod 0 wrote its replay into the file"
    );
    set.shutdown().await;
}
