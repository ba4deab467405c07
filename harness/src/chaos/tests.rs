use std::time::Duration;

use super::*;
use crate::writer::WriterReport;

#[test]
fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
    let a = Schedule::generate(7, 3, 8, Duration::from_secs(20));
    let b = Schedule::generate(7, 3, 8, Duration::from_secs(20));
    let c = Schedule::generate(8, 3, 8, Duration::from_secs(20));
    assert_eq!(a, b);
    assert_ne!(a, c);
    let faults = a
        .events
        .iter()
        .filter(|e| !matches!(e.fault, Fault::Backup(_)))
        .count();
    assert_eq!(faults, 8);
}

#[test]
fn a_schedule_loses_at_most_one_volume_and_never_faults_a_pod_twice_at_once() {
    for seed in 0..200 {
        let s = Schedule::generate(seed, 3, 10, Duration::from_secs(20));
        let losses = s
            .events
            .iter()
            .filter(|e| matches!(e.fault, Fault::LoseVolume(_)))
            .count();
        assert!(losses <= 1, "{s}");
        let faults: Vec<&Event> = s
            .events
            .iter()
            .filter(|e| !matches!(e.fault, Fault::Backup(_)))
            .collect();
        for (i, a) in faults.iter().enumerate() {
            for b in &faults[i + 1..] {
                let overlap = b.at < a.at + a.lasts && a.at < b.at + b.lasts;
                let shared = match (a.fault.pod(), b.fault.pod()) {
                    (Some(x), Some(y)) => x == y,
                    _ => true,
                };
                assert!(!(overlap && shared), "{s}");
            }
        }
    }
}

#[test]
fn quorum_loss_counts_only_while_a_majority_is_down() {
    let ev = |at: u64, lasts: u64, fault| Event {
        at: Duration::from_millis(at),
        lasts: Duration::from_millis(lasts),
        fault,
    };
    let s = Schedule {
        seed: 0,
        pods: 3,
        defrag: false,
        disaster: None,
        events: vec![
            ev(0, 1000, Fault::KillPod(0)),
            ev(600, 1000, Fault::Pause(1)),
            ev(2000, 500, Fault::WithdrawDns(2)),
            ev(3000, 700, Fault::RestartAll(vec![2, 0, 1])),
        ],
    };
    assert_eq!(s.longest_quorum_loss(), Duration::from_millis(700));
    let none = Schedule {
        seed: 0,
        pods: 3,
        defrag: false,
        disaster: None,
        events: vec![
            ev(0, 1000, Fault::KillSidecar(0)),
            ev(0, 1000, Fault::Pause(1)),
        ],
    };
    assert_eq!(none.longest_quorum_loss(), Duration::ZERO);
    // Where a withdrawn name cuts the pod off (Docker), it counts as down.
    let dns = Schedule {
        events: vec![
            ev(0, 1000, Fault::WithdrawDns(0)),
            ev(400, 1000, Fault::Pause(1)),
        ],
        ..none.clone()
    };
    assert_eq!(dns.longest_quorum_loss(), Duration::ZERO);
    let cut = dns.longest_quorum_loss_where(|f| match f {
        Fault::WithdrawDns(o) => vec![*o],
        f => f.pods_down(),
    });
    assert_eq!(cut, Duration::from_millis(600));
}

#[test]
fn a_sentinel_set_aside_is_found_a_deleted_one_is_missing_and_a_lost_volume_is_exempt() {
    let root = tempfile::tempdir().unwrap();
    let volume = |o: u32| root.path().join(format!("pod-{o}"));
    let mut s = Sentinels::new(7);
    for o in 0..3 {
        // No live data yet: nothing planted.
        s.plant(o, &volume(o));
        std::fs::create_dir_all(volume(o).join("member/wal")).unwrap();
        s.plant(o, &volume(o));
        s.plant(o, &volume(o)); // one per live directory
    }
    assert_eq!(s.count(), 3);
    assert!(s.missing(volume).is_empty());
    // Pod 0's data renamed aside (what the agent does), pod 1's deleted, pod 2's volume
    // lost on purpose.
    let aside = volume(0).join("set-aside/2026-11-24T00:00:00Z");
    std::fs::create_dir_all(&aside).unwrap();
    std::fs::rename(volume(0).join("member"), aside.join("member")).unwrap();
    std::fs::remove_dir_all(volume(1).join("member")).unwrap();
    std::fs::remove_dir_all(volume(2)).unwrap();
    s.volume_lost(2);
    let missing = s.missing(volume);
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert_eq!(missing[0].0, 1);
    assert!(missing[0].1.starts_with(SENTINEL_PREFIX), "{missing:?}");
    // The new live data of a set-aside volume gets a sentinel of its own.
    std::fs::create_dir_all(volume(0).join("member")).unwrap();
    s.plant(0, &volume(0));
    assert_eq!(s.count(), 4);
}

#[test]
fn a_backups_manifest_line_is_read_for_verification_and_cluster() {
    let ok = BackupTaken::from_parts(
        1,
        false,
        true,
        "{\"key\":\"x\",\"cluster_id\":\"2a\",\"verified\":true}\n",
        "",
    );
    assert!(ok.exited_ok && ok.verified, "{ok:?}");
    assert_eq!(ok.cluster, Some(0x2a));
    let unverified = BackupTaken::from_parts(
        1,
        false,
        true,
        "{\"cluster_id\":\"2a\",\"verified\":false}",
        "",
    );
    assert!(!unverified.verified);
    let failed =
        BackupTaken::from_parts(2, true, false, "", "starting\nno leader: etcd-1 paused\n");
    assert!(!failed.exited_ok && !failed.verified && failed.cluster.is_none());
    assert_eq!(failed.error, "no leader: etcd-1 paused");
}

/// An outcome the checker finds nothing wrong with: one refusal of writes, explained by
/// nothing but short enough.
fn clean() -> Outcome {
    Outcome {
        seed: 1,
        faults: 3,
        writes: WriterReport {
            acked: 100,
            failures: 2,
            max_gap: Duration::from_secs(1),
            max_gap_at: Duration::from_secs(3),
            refusals: vec![(Duration::from_secs(2), Duration::from_secs(3))],
            last_error: String::new(),
            revisions: vec![],
            acked_at: vec![],
        },
        missing: vec![Some(0), Some(0), Some(0)],
        clusters: [9].into_iter().collect(),
        reused_ids: vec![],
        replaced: vec![],
        corrupted: None,
        rebuilt: None,
        healed_after: None,
        rebuild_stops: vec![],
        unwritten: vec![],
        values_unread: vec![],
        recovered: true,
        sentinels: 3,
        deleted: vec![],
        enospc_lines: 0,
        defrags: 0,
        backups: vec![BackupTaken {
            pod: 0,
            after_healing: true,
            exited_ok: true,
            verified: true,
            cluster: Some(9),
            error: String::new(),
        }],
        played: vec![],
        slack: Duration::ZERO,
        disaster_window: None,
        wal_records: 3,
        wal_missing: vec![],
        disaster: None,
        kube: None,
    }
}

#[test]
fn the_checker_flags_a_lost_write_a_second_cluster_and_a_reused_id() {
    let clean = clean();
    assert!(clean.violations().is_empty());
    assert!(clean.tsv_line().ends_with("\tok"));
    let mut bad = clean.clone();
    bad.missing[1] = Some(4);
    bad.clusters.insert(10);
    bad.reused_ids.push(0xabc);
    bad.writes.max_gap = Duration::from_secs(30);
    bad.writes
        .refusals
        .push((Duration::from_secs(5), Duration::from_secs(35)));
    let v = bad.violations();
    assert_eq!(v.len(), 4, "{v:?}");
    assert_eq!(bad.lost(), 4);
    assert!(bad.tsv_line().ends_with("\tFAILED"));
    let mut deleted = clean.clone();
    deleted.deleted.push((2, "chaos-sentinel-1-2-0".into()));
    let v = deleted.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("pod 2") && v[0].contains("chaos-sentinel-1-2-0"),
        "{v:?}"
    );
    // A backup during the faults may fail (said so); one that exits 0 must be a
    // verified snapshot of this cluster, and the one after healing must succeed.
    let mut backups = clean.clone();
    backups.backups.push(BackupTaken {
        pod: 1,
        after_healing: false,
        exited_ok: false,
        verified: false,
        cluster: None,
        error: "no quorum".into(),
    });
    assert!(
        backups.violations().is_empty(),
        "{:?}",
        backups.violations()
    );
    backups.backups[1].exited_ok = true;
    backups.backups[0].exited_ok = false;
    assert_eq!(backups.violations().len(), 2, "{:?}", backups.violations());
    backups.backups.clear();
    assert_eq!(backups.violations().len(), 1, "{:?}", backups.violations());
}

#[test]
fn a_sentinel_travels_with_data_set_aside_and_is_missed_when_data_is_deleted() {
    let root = tempfile::tempdir().unwrap();
    let vol = |o: u32| root.path().join(format!("pod-{o}"));
    for o in 0..3 {
        std::fs::create_dir_all(vol(o).join("member/wal")).unwrap();
    }
    let mut s = Sentinels::new(5);
    for o in 0..3 {
        s.plant(o, &vol(o));
        s.plant(o, &vol(o));
    }
    assert_eq!(s.count(), 3, "one sentinel per live data directory");
    // Pod 0's data set aside the way the agent does it (member/ renamed).
    std::fs::create_dir_all(vol(0).join("set-aside/7-removed-member")).unwrap();
    std::fs::rename(
        vol(0).join("member"),
        vol(0).join("set-aside/7-removed-member/member"),
    )
    .unwrap();
    // Pod 1's data deleted; pod 2's volume lost on purpose.
    std::fs::remove_dir_all(vol(1).join("member")).unwrap();
    std::fs::remove_dir_all(vol(2).join("member")).unwrap();
    s.volume_lost(2);
    assert_eq!(
        s.missing(vol),
        vec![(1, "chaos-sentinel-5-1-1".to_string())]
    );
    // A fresh member/ on pod 0 gets a sentinel of its own.
    std::fs::create_dir_all(vol(0).join("member")).unwrap();
    s.plant(0, &vol(0));
    assert_eq!(s.count(), 4);
}

#[test]
fn a_refusal_is_explained_only_by_the_faults_it_overlaps_and_their_cost_after_healing() {
    let secs = |s: f64| Duration::from_secs_f64(s);
    let ev = |at: f64, lasts: f64, fault| Event {
        at: secs(at),
        lasts: secs(lasts),
        fault,
    };
    let played = vec![
        ev(5.0, 1.0, Fault::RestartAll(vec![0, 1, 2])),
        ev(20.0, 3.0, Fault::KillSidecar(1)),
        ev(30.0, 2.0, Fault::Pause(2)),
    ];
    let restart_ends = 6.0 + Fault::RestartAll(vec![]).cost().as_secs_f64();
    let windows = explained(&played, Duration::ZERO);
    // A killed sidecar refuses no write: it explains nothing.
    assert_eq!(windows.len(), 2, "{windows:?}");
    assert_eq!(windows[0], (secs(5.0), secs(restart_ends)));
    // Within the restart's window, nothing is unexplained; ten seconds past it, ten.
    assert_eq!(
        uncovered(secs(5.1), secs(restart_ends), &windows),
        Duration::ZERO
    );
    let late = uncovered(secs(5.1), secs(restart_ends + 10.0), &windows);
    assert_eq!(late, secs(10.0));
    // Overlapping windows count once; a gap between them is unexplained.
    let both = [
        (secs(0.0), secs(4.0)),
        (secs(2.0), secs(6.0)),
        (secs(8.0), secs(9.0)),
    ];
    assert_eq!(uncovered(secs(1.0), secs(10.0), &both), secs(3.0));
    // During the sidecar's kill, writes refused are unexplained.
    assert_eq!(uncovered(secs(20.0), secs(23.0), &windows), secs(3.0));

    let mut o = Outcome { played, ..clean() };
    o.writes.refusals = vec![(secs(5.0), secs(restart_ends)), (secs(30.5), secs(33.0))];
    assert!(o.violations().is_empty(), "{:?}", o.violations());
    assert_eq!(o.unexplained().length, Duration::ZERO);
    // The restart of every pod stalls writes ten seconds longer (a restart path that
    // waits on its silent peers): flagged, and published.
    o.writes.refusals[0].1 += secs(10.0);
    let u = o.unexplained();
    assert_eq!(u.length, secs(10.0));
    assert_eq!(u.refusal.0, secs(5.0));
    let v = o.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("explained by no fault"), "{v:?}");
    // A disaster's window (the recovery bound and the time held) explains it.
    o.disaster_window = Some((secs(10.0), secs(200.0)));
    assert!(o.violations().is_empty(), "{:?}", o.violations());
    // Up to the bound, unexplained refusal is tolerated.
    o.disaster_window = None;
    o.writes.refusals[0].1 = secs(restart_ends) + UNEXPLAINED_BOUND;
    assert!(o.violations().is_empty(), "{:?}", o.violations());
    o.writes.refusals[0].1 += Duration::from_millis(1);
    assert_eq!(o.violations().len(), 1);
}

#[test]
fn a_wal_deleted_beside_a_kept_folder_is_a_violation() {
    let mut o = clean();
    assert!(o.violations().is_empty(), "{:?}", o.violations());
    o.wal_missing.push((
        1,
        "WAL [\"0000000000000000-0000000000000000.wal\"] ... is gone".into(),
    ));
    let v = o.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("pod 1") && v[0].contains("deleted, not set aside"),
        "{v:?}"
    );
}

#[test]
fn the_new_faults_appear_and_count_as_down() {
    let all: Vec<Fault> = (0..50)
        .flat_map(|seed| Schedule::generate(seed, 3, 8, Duration::from_secs(20)).events)
        .map(|e| e.fault)
        .collect();
    assert!(all.iter().any(|f| matches!(f, Fault::Partition(_))));
    assert!(all.iter().any(|f| matches!(f, Fault::FillDisk(_))));
    assert_eq!(Fault::Partition(1).pods_down(), vec![1]);
    assert_eq!(Fault::FillDisk(2).pods_down(), vec![2]);
}

/// Generator 5 adds one corrupted value to generator 2's faults, on a pod that carries no
/// other fault meanwhile and while no volume is lost; everything else is generator 2's.
#[test]
fn a_corrupting_schedule_corrupts_one_value_on_a_pod_free_of_other_faults_and_of_losses() {
    let mut pods_seen = std::collections::BTreeSet::new();
    for seed in 0..300 {
        let s = Schedule::generate_corrupt(seed, 3, 7, Duration::from_secs(20));
        let corrupt: Vec<&Event> = s
            .events
            .iter()
            .filter(|e| matches!(e.fault, Fault::CorruptValue(_)))
            .collect();
        assert_eq!(corrupt.len(), 1, "seed {seed}: one corrupted value\n{s}");
        assert!(s.corrupts());
        let c = corrupt[0];
        pods_seen.extend(c.fault.pod());
        for e in &s.events {
            if e == c || matches!(e.fault, Fault::Backup(_)) {
                continue;
            }
            let apart = e.at >= c.at + c.lasts || c.at >= e.at + e.lasts;
            let shares = e.fault.pod().is_none_or(|o| Some(o) == c.fault.pod())
                || matches!(e.fault, Fault::LoseVolume(_));
            assert!(
                apart || !shares,
                "seed {seed}: the corrupted pod carries another fault, or a volume is lost meanwhile\n{s}"
            );
        }
        let mut rest = s.clone();
        rest.events.retain(|e| e != c);
        assert_eq!(
            rest,
            Schedule::generate(seed, 3, 7, Duration::from_secs(20)),
            "seed {seed}: generator 2's faults"
        );
        assert_eq!(
            c.fault.to_string(),
            format!("corrupt a value on pod {}'s disk", c.fault.pod().unwrap())
        );
    }
    assert_eq!(
        pods_seen.len(),
        3,
        "every pod gets corrupted in some schedule"
    );
    assert!(!Schedule::generate(1, 3, 7, Duration::from_secs(20)).corrupts());
    assert_eq!(Fault::CorruptValue(2).pods_down(), vec![2]);
}

/// A seed replays its schedule only under the generator that wrote its line: the schedules
/// of generators 2, 3 and 4 are those main generated before generator 5 came.
#[test]
fn the_older_generators_draw_the_same_schedules_as_before_generator_5() {
    let g2 = Schedule::generate(8, 3, 7, Duration::from_secs(20)).to_string();
    assert_eq!(
        g2,
        "schedule of seed 8:
  sidecars with --defrag-threshold=1%,1B throughout
  at   2919 ms for  4609 ms: cut pod 1 from its peers
  at   4567 ms for  3267 ms: kill pod 2
  at   5198 ms for     0 ms: back up through pod 0
  at  12164 ms for   398 ms: kill pod 0
  at  13107 ms for   360 ms: pause pod 1's etcd
  at  14326 ms for     0 ms: back up through pod 0
  at  14952 ms for  2683 ms: cut pod 0 from its peers
  at  16216 ms for  1442 ms: kill pod 2's sidecar
  at  19801 ms for  1310 ms: restart every pod, in order [2, 1, 0]
"
    );
    let g2 = Schedule::generate(1, 3, 7, Duration::from_secs(20)).to_string();
    assert_eq!(
        g2,
        "schedule of seed 1:
  at   1152 ms for  3475 ms: pause pod 2's etcd
  at   3023 ms for  3178 ms: withdraw pod 1's DNS name
  at   5920 ms for  3440 ms: cut pod 0 from its peers
  at   7677 ms for  1661 ms: kill pod 1
  at  11416 ms for   773 ms: withdraw pod 2's DNS name
  at  12532 ms for     0 ms: back up through pod 2
  at  13650 ms for     0 ms: back up through pod 2
  at  17036 ms for  1708 ms: fill pod 1's volume
  at  17532 ms for  2894 ms: fill pod 2's volume
"
    );
    let g3 = Schedule::generate_disaster(2, 3, 3, Duration::from_secs(8)).to_string();
    assert_eq!(
        g3,
        "schedule of seed 2:
  at    611 ms for     0 ms: back up through pod 0
  at   1753 ms for  2690 ms: pause pod 0's etcd
  at   2839 ms for  3140 ms: fill pod 2's volume
  at   3984 ms for     0 ms: back up through pod 1
  at   7452 ms for  1534 ms: lose pod 2's volume
  then, every fault healed: after a verified backup, lose every pod's volume
"
    );
    let g4 = Schedule::generate_disaster_with_keys(1, 3, 3, Duration::from_secs(8)).to_string();
    assert_eq!(
        g4,
        "schedule of seed 1:
  at    225 ms for  1661 ms: kill pod 1
  at    347 ms for     0 ms: back up through pod 0
  at   1398 ms for  3475 ms: pause pod 2's etcd
  at   4307 ms for  1708 ms: fill pod 1's volume
  at   5599 ms for     0 ms: back up through pod 1
  then, every fault healed: after a verified encrypted backup, lose every pod's volume; start the pods with a key that opens no backup, then with the right one
"
    );
}

#[test]
fn the_checker_flags_a_value_never_written_and_a_pod_that_did_not_answer_for_its_values() {
    let mut bad = clean();
    bad.corrupted = Some((1, Some(7)));
    assert!(
        bad.violations().is_empty(),
        "a corruption healed is no violation"
    );
    bad.unwritten
        .push((1, "w/00000007".into(), "corrupt-00000007".into()));
    bad.values_unread.push(2);
    let v = bad.violations();
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(
        v[0].contains("pod 1")
            && v[0].contains("corrupt-00000007")
            && v[0].contains("never written"),
        "{v:?}"
    );
    assert!(v[1].contains("pod 2"), "{v:?}");
}

/// The runner changes the newest value of the first half of the acknowledged writes found in
/// the file, every copy of it and nothing else, into as many bytes.
#[test]
fn a_value_is_corrupted_in_every_copy_and_nothing_else_is_touched() {
    use super::corrupt::corrupt_value;
    use crate::writer::write_value;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("member/snap")).unwrap();
    let db = dir.path().join("member/snap/db");
    let mut bytes = b"\x00\x01header".to_vec();
    for i in [1u64, 3, 4, 3, 9] {
        bytes.extend(write_value(i).as_bytes());
        bytes.extend(b"\x12\x00");
    }
    std::fs::write(&db, &bytes).unwrap();
    // Ten acknowledged: the first half is 0..5; 4 is the newest there.
    let changed = corrupt_value(dir.path(), 10).unwrap().unwrap();
    assert_eq!((changed.i, changed.copies), (4, 1));
    let after = std::fs::read(&db).unwrap();
    assert_eq!(after.len(), bytes.len());
    let text = String::from_utf8_lossy(&after);
    assert!(text.contains("corrupt-00000004") && !text.contains(&write_value(4)));
    let changed = corrupt_value(dir.path(), 10).unwrap().unwrap();
    assert_eq!((changed.i, changed.copies), (3, 2), "both copies");
    let text = String::from_utf8_lossy(&std::fs::read(&db).unwrap()).into_owned();
    assert_eq!(
        text.matches("written-").count(),
        2,
        "1 and 9 untouched: {text}"
    );
    assert!(
        corrupt_value(dir.path(), 2).unwrap().is_none(),
        "0 is not in the file"
    );
}

/// A corrupted value's pod is down from the fault until it is started again, and its etcd
/// stops again when the agent rebuilds it; meanwhile the healthy majority keeps serving
/// writes. So the fault explains refusals while its pod is down and after each stop of the
/// rebuild (a restart's cost each), never the whole rebuild: writes refused through the
/// majority between those are a violation, however long the rebuild takes to end.
#[test]
fn a_corrupted_value_explains_refusals_while_its_pod_is_down_and_at_each_rebuild_stop_only() {
    let secs = |s: f64| Duration::from_secs_f64(s);
    let cost = Fault::CorruptValue(1).cost();
    let mut o = Outcome {
        played: vec![Event {
            at: secs(10.0),
            lasts: secs(1.0),
            fault: Fault::CorruptValue(1),
        }],
        corrupted: Some((1, Some(40))),
        rebuilt: Some(1),
        healed_after: Some(secs(60.0)),
        rebuild_stops: vec![secs(30.0)],
        ..clean()
    };
    // Down, then started again on the corrupted value; then stopped by the agent.
    o.writes.refusals = vec![
        (secs(10.2), secs(11.0) + cost),
        (secs(29.5), secs(30.0) + cost),
    ];
    assert!(o.violations().is_empty(), "{:?}", o.violations());
    // Writes refused while the rebuild is under way but its pod's etcd did not stop: the
    // majority refused them, and the rebuild explains nothing of it.
    o.writes.refusals.push((secs(18.0), secs(22.0)));
    let u = o.unexplained();
    assert_eq!(u.refusal, (secs(18.0), secs(22.0)));
    assert_eq!(u.length, secs(4.0));
    let v = o.violations();
    assert!(
        v.len() == 1 && v[0].contains("explained by no fault"),
        "{v:?}"
    );
}
