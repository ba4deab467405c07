//! Scenarios for the pure `decide`: one test per situation a pod can find itself in,
//! named after what it proves, and property tests for the rules that keep data safe.

use std::net::{IpAddr, Ipv4Addr};

use etcd_steward::decision::parse_restore_point;
use etcd_steward::decision::{
    decide, formation_token, Action, Bootstrap, Decision, SetAsideWhy, Why,
};
use etcd_steward::facts::{ArchiveReach, PointAt};
use etcd_steward::facts::{
    BackupFacts, ClusterFacts, ClusterView, DataDirState, Endpoint, Facts, Formation, LeftMarker,
    Lookup, MemberInfo, PeerFacts, PeerReport, RecoveryMarker, RecoveryRequest, RestoreRequest,
    RestoreWanted, SnapshotContent, SnapshotFacts, VersionFacts, WalIdentity, WalState, WalTail,
};
use etcd_steward::facts::{EtcdVersion, PeerVersion};
use etcd_steward::facts::{Failed, Rejection};

// ---------------------------------------------------------------------------------------
// Small constructors: a three-pod set `etcd` in namespace `default`.
// ---------------------------------------------------------------------------------------

const REPLICAS: u32 = 3;
const CLUSTER: u64 = 0xc1a5_7e55;
const OTHER_CLUSTER: u64 = 0xf0_4e16;

fn pod(o: u32) -> String {
    format!("etcd-{o}")
}

fn host(o: u32) -> String {
    format!("etcd-{o}.etcd.default.svc.cluster.local")
}

fn peer_url(o: u32) -> String {
    format!("http://{}:2380", host(o))
}

fn initial_cluster(replicas: u32) -> String {
    (0..replicas)
        .map(|o| format!("{}={}", pod(o), peer_url(o)))
        .collect::<Vec<_>>()
        .join(",")
}

fn ip(o: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, 10 + o as u8))
}

fn found(o: u32) -> Lookup {
    Lookup::Found(vec![ip(o)])
}

fn empty_dir() -> DataDirState {
    DataDirState {
        wal: WalState::None,
        formation: None,
        notes: vec![],
        rejected_snapshots: vec![],
        unreadable_markers: vec![],
        ..Default::default()
    }
}

fn wal_of(member_id: u64, cluster_id: u64) -> DataDirState {
    DataDirState {
        wal: WalState::Present(Ok(WalIdentity {
            member_id,
            cluster_id,
        })),
        formation: None,
        notes: vec![],
        rejected_snapshots: vec![],
        unreadable_markers: vec![],
        ..Default::default()
    }
}

fn unreadable_wal() -> DataDirState {
    DataDirState {
        wal: WalState::Present(Err(
            "member/wal/0.wal: WAL ends inside a record frame".into()
        )),
        formation: None,
        notes: vec![],
        rejected_snapshots: vec![],
        unreadable_markers: vec![],
        ..Default::default()
    }
}

fn marker(nonce: &str) -> Formation {
    Formation {
        nonce: nonce.into(),
        initial_cluster: initial_cluster(REPLICAS),
        token: None,
        snapshot: None,
    }
}

fn marker_with_token(nonce: &str, token: &str) -> Formation {
    Formation {
        token: Some(token.into()),
        ..marker(nonce)
    }
}

fn empty_report(o: u32) -> PeerReport {
    PeerReport {
        name: pod(o),
        has_data: false,
        wal: None,
        wal_error: None,
        formation: None,
        ..Default::default()
    }
}

/// A peer whose DNS name resolves and whose sidecar answered `report`.
fn answering(o: u32, report: PeerReport) -> PeerFacts {
    PeerFacts {
        ordinal: o,
        name: pod(o),
        dns: found(o),
        report: Some(Ok(report)),
    }
}

fn empty_peer(o: u32) -> PeerFacts {
    answering(o, empty_report(o))
}

fn prepared_peer(o: u32, nonce: &str) -> PeerFacts {
    answering(
        o,
        PeerReport {
            formation: Some(marker(nonce)),
            ..empty_report(o)
        },
    )
}

/// A peer whose etcd already started: its volume holds a WAL and its formation marker.
fn started_peer(o: u32, member_id: u64, formation: Option<Formation>) -> PeerFacts {
    answering(
        o,
        PeerReport {
            has_data: true,
            wal: Some(WalIdentity {
                member_id,
                cluster_id: CLUSTER,
            }),
            formation,
            ..empty_report(o)
        },
    )
}

fn unpublished_peer(o: u32) -> PeerFacts {
    PeerFacts {
        ordinal: o,
        name: pod(o),
        dns: Lookup::NotFound,
        report: None,
    }
}

fn member(id: u64, o: u32, name: &str, is_learner: bool) -> MemberInfo {
    MemberInfo {
        id,
        name: name.into(),
        peer_urls: vec![peer_url(o)],
        client_urls: if name.is_empty() {
            vec![]
        } else {
            vec![format!("http://{}:2379", host(o))]
        },
        is_learner,
    }
}

fn started_voter(id: u64, o: u32) -> MemberInfo {
    member(id, o, &pod(o), false)
}

/// The member that answered for the cluster (membership changes go there).
fn via() -> Endpoint {
    Endpoint {
        host: host(0),
        ip: ip(0),
    }
}

fn healthy(members: Vec<MemberInfo>) -> ClusterFacts {
    ClusterFacts::Healthy(ClusterView {
        source: via(),
        cluster_id: CLUSTER,
        leader: 0xa0,
        members,
    })
}

/// Voters `etcd-0` (0xa0) and `etcd-2` (0xa2), both started; no member for `etcd-1`.
fn healthy_without_us() -> ClusterFacts {
    healthy(vec![started_voter(0xa0, 0), started_voter(0xa2, 2)])
}

fn healthy_with(ours: MemberInfo) -> ClusterFacts {
    healthy(vec![started_voter(0xa0, 0), ours, started_voter(0xa2, 2)])
}

fn not_reached() -> ClusterFacts {
    ClusterFacts::NotReached {
        tried: vec![
            format!("{}: connection refused", host(0)),
            format!("{}: connection refused", host(2)),
        ],
    }
}

/// Pod `etcd-1` of three, empty volume, own name published, no cluster answered, and
/// both other initial pods answering with empty volumes and no marker.
fn facts() -> Facts {
    facts_for(1)
}

fn facts_for(ordinal: u32) -> Facts {
    Facts {
        ordinal,
        name: pod(ordinal),
        set_name: "etcd".into(),
        host: host(ordinal),
        peer_url: peer_url(ordinal),
        replicas: REPLICAS,
        initial_cluster: initial_cluster(REPLICAS),
        data: empty_dir(),
        own_dns: found(ordinal),
        cluster: not_reached(),
        peers: (0..REPLICAS)
            .filter(|o| *o != ordinal)
            .map(empty_peer)
            .collect(),
        backups: BackupFacts::Off,
        fresh_nonce: "fresh".into(),
        recovery_request: None,
        restore_request: None,
        rebuild_request: None,
        versions: VersionFacts::default(),
    }
}

fn with_marker(mut f: Facts, formation: Formation) -> Facts {
    f.data.formation = Some(formation);
    f
}

fn with_peer(mut f: Facts, peer: PeerFacts) -> Facts {
    f.peers.retain(|p| p.ordinal != peer.ordinal);
    f.peers.push(peer);
    f
}

#[track_caller]
fn assert_reason(d: &Decision, needles: &[&str]) {
    for n in needles {
        assert!(
            d.reason().contains(n),
            "reason of {:?} should mention {n:?}: {}",
            d.action,
            d.reason()
        );
    }
}

#[track_caller]
fn assert_waits(d: &Decision, needles: &[&str]) {
    assert_eq!(d.action, Action::Wait, "{}", d.reason());
    assert_reason(d, needles);
}

#[track_caller]
fn assert_starts(d: &Decision, formation: Formation) {
    assert_eq!(
        d.action,
        Action::Bootstrap(Bootstrap::Start {
            nonce: formation.nonce.clone(),
            initial_cluster: formation.initial_cluster.clone(),
            token: formation.token.clone().unwrap_or_default(),
            snapshot: formation.snapshot.clone(),
        }),
        "{}",
        d.reason()
    );
}

// ---------------------------------------------------------------------------------------
// A recovery from the freshest surviving volume (`recover --yes`).
// ---------------------------------------------------------------------------------------

fn tail(commit: u64) -> WalTail {
    WalTail {
        last_index: commit,
        last_term: 4,
        commit,
        term: 4,
        clean_end: true,
    }
}

fn request_for(survivor: u32) -> RecoveryRequest {
    RecoveryRequest {
        id: "r1".into(),
        survivor: pod(survivor),
        force_lost: vec![],
        expires_unix: u64::MAX,
    }
}

/// Pod 0 holds data with `commit`; the other pods' volumes are empty; no cluster answers.
fn survivor_facts(commit: u64) -> Facts {
    let mut f = Facts {
        data: wal_of(0xa1, CLUSTER),
        ..facts_for(0)
    };
    f.data.tail = Some(tail(commit));
    f
}

#[test]
fn a_recovery_request_naming_this_pod_forces_a_one_member_cluster_when_its_own_plan_agrees() {
    let f = Facts {
        recovery_request: Some(request_for(0)),
        ..survivor_facts(500)
    };
    let d = decide(&f);
    assert_eq!(
        d.action,
        Action::Recover {
            id: "r1".into(),
            commit: 500,
            first: true
        },
        "{}",
        d.reason()
    );
    assert_reason(&d, &["--force-new-cluster", "commit index 500"]);
}

#[test]
fn a_recovery_request_is_not_acted_on_when_a_peer_holds_a_fresher_volume() {
    let fresher = PeerReport {
        has_data: true,
        wal: Some(WalIdentity {
            member_id: 0xb2,
            cluster_id: CLUSTER,
        }),
        log: Some(tail(900)),
        ..empty_report(2)
    };
    let f = Facts {
        recovery_request: Some(request_for(0)),
        ..with_peer(survivor_facts(500), answering(2, fresher))
    };
    assert_waits(&decide(&f), &["etcd-2 holds the freshest volume"]);
}

#[test]
fn a_recovery_request_is_not_acted_on_while_a_peer_is_silent() {
    let f = Facts {
        recovery_request: Some(request_for(0)),
        ..with_peer(survivor_facts(500), unpublished_peer(2))
    };
    assert_waits(&decide(&f), &["refuse", "etcd-2", "--force-lost"]);
    let mut lost = request_for(0);
    lost.force_lost = vec![pod(2)];
    let f = Facts {
        recovery_request: Some(lost),
        ..with_peer(survivor_facts(500), unpublished_peer(2))
    };
    assert!(matches!(decide(&f).action, Action::Recover { .. }));
}

#[test]
fn a_recovery_request_naming_another_pod_changes_nothing_here() {
    let f = Facts {
        recovery_request: Some(request_for(1)),
        ..survivor_facts(500)
    };
    assert_eq!(decide(&f).action, Action::Restart);
}

#[test]
fn a_recovery_request_is_ignored_while_a_cluster_answers() {
    let mut f = Facts {
        recovery_request: Some(request_for(0)),
        ..survivor_facts(500)
    };
    f.cluster = healthy(vec![started_voter(0xa1, 0), started_voter(0xb2, 1)]);
    assert_eq!(decide(&f).action, Action::Restart);
}

#[test]
fn a_forced_start_killed_before_it_committed_is_forced_again() {
    let mut f = survivor_facts(500);
    f.data.recovery = Some(RecoveryMarker {
        id: "r1".into(),
        commit: 500,
    });
    let d = decide(&f);
    assert_eq!(
        d.action,
        Action::Recover {
            id: "r1".into(),
            commit: 500,
            first: false
        }
    );
}

#[test]
fn a_forced_start_that_committed_is_never_forced_again_even_with_the_request_still_held() {
    let mut f = Facts {
        recovery_request: Some(request_for(0)),
        ..survivor_facts(503)
    };
    f.data.recovery = Some(RecoveryMarker {
        id: "r1".into(),
        commit: 500,
    });
    assert_eq!(decide(&f).action, Action::Restart);
}

#[test]
fn without_a_readable_wal_tail_nothing_is_forced() {
    let mut f = Facts {
        recovery_request: Some(request_for(0)),
        ..survivor_facts(500)
    };
    f.data.tail = None;
    f.data.recovery = Some(RecoveryMarker {
        id: "r0".into(),
        commit: 10,
    });
    assert_eq!(decide(&f).action, Action::Restart);
}

#[test]
fn a_member_listed_under_its_old_peer_url_is_updated_not_replaced() {
    let mut old = started_voter(0xa1, 1);
    old.peer_urls = vec!["http://etcd-1.old-service.default.svc.cluster.local:2380".into()];
    let f = Facts {
        data: wal_of(0xa1, CLUSTER),
        cluster: healthy(vec![old, started_voter(0xb2, 0)]),
        ..facts()
    };
    let d = decide(&f);
    assert_eq!(
        d.action,
        Action::UpdatePeerUrls {
            member: 0xa1,
            via: via()
        },
        "{}",
        d.reason()
    );
    assert_reason(
        &d,
        &["old-service", "MemberUpdate", "keeping its ID and data"],
    );
    // Once updated, a plain restart.
    let f = Facts {
        cluster: healthy(vec![started_voter(0xa1, 1), started_voter(0xb2, 0)]),
        ..f
    };
    assert_eq!(decide(&f).action, Action::Restart);
}

fn left(member_id: u64) -> Option<LeftMarker> {
    Some(LeftMarker { ts: 1, member_id })
}

#[test]
fn a_pod_that_left_sets_its_data_aside_only_once_the_cluster_no_longer_lists_it() {
    let mut f = Facts {
        data: wal_of(0xa1, CLUSTER),
        ..facts()
    };
    f.data.left = left(0xa1);
    f.cluster = healthy(vec![started_voter(0xb2, 0), started_voter(0xc3, 2)]);
    assert_eq!(
        decide(&f).action,
        Action::SetAside {
            why: SetAsideWhy::Left
        }
    );
    f.cluster = healthy(vec![started_voter(0xa1, 1), started_voter(0xb2, 0)]);
    assert_waits(&decide(&f), &["still lists member a1", "data is kept"]);
    f.cluster = not_reached();
    assert_waits(&decide(&f), &["no cluster answered", "data is kept"]);
}

#[test]
fn a_pod_that_left_never_joins_until_rejoin() {
    let mut f = Facts {
        cluster: healthy_without_us(),
        ..facts()
    };
    f.data.left = left(0xa1);
    assert_waits(&decide(&f), &["etcd-steward rejoin"]);
    f.data.left = None;
    assert!(matches!(decide(&f).action, Action::Join { .. }));
}

/// A leave or restore marker that cannot be read: whether the pod left, or its volume was
/// already set aside for a restore, is unknown. An empty volume does not join, a volume with
/// data is neither started nor set aside: init waits, naming the file.
#[test]
fn an_unreadable_leave_or_restore_marker_makes_init_wait_naming_it() {
    let unreadable = vec!["leave marker /data/steward-left.json: EOF while parsing".to_string()];
    let mut f = Facts {
        cluster: healthy_without_us(),
        ..facts()
    };
    f.data.unreadable_markers = unreadable.clone();
    assert_waits(&decide(&f), &["steward-left.json", "the data is kept"]);
    let mut f = Facts {
        data: wal_of(0xa1, CLUSTER),
        ..facts()
    };
    f.cluster = healthy(vec![started_voter(0xb2, 0), started_voter(0xc3, 2)]);
    f.data.unreadable_markers =
        vec!["restore marker /data/member/steward/restored-for.json: Permission denied".into()];
    assert_waits(&decide(&f), &["restored-for.json", "nothing is done"]);
    f.data.unreadable_markers = vec![];
    assert_ne!(
        decide(&f).action,
        Action::Wait,
        "readable markers decide as before"
    );
}

/// The survivor of a recovery whose marker is torn: read as "no marker", the request still
/// held would force a second new cluster on it. init waits, naming the file.
#[test]
fn an_unreadable_recovery_marker_never_forces_a_second_new_cluster() {
    let mut f = Facts {
        recovery_request: Some(request_for(0)),
        ..survivor_facts(503)
    };
    assert!(
        matches!(decide(&f).action, Action::Recover { first: true, .. }),
        "without the marker, the held request forces a new cluster"
    );
    for broken in [
        "recovery marker /data/member/steward/recovery.json: EOF while parsing an object at line 1 column 9",
        "recovery marker /data/member/steward/recovery.json: expected value at line 1 column 1",
    ] {
        f.data.unreadable_markers = vec![broken.into()];
        assert_waits(&decide(&f), &["recovery.json", "a recovery", "nothing is done"]);
    }
}

/// A pod that prepared a formation (its nonce in the others' token) whose marker is torn:
/// read as "no marker" it would prepare afresh with a new nonce. init waits, naming it.
#[test]
fn an_unreadable_formation_marker_never_prepares_afresh() {
    let mut f = facts();
    f.peers = vec![prepared_peer(0, "n0"), prepared_peer(2, "n2")];
    assert!(
        matches!(
            decide(&f).action,
            Action::Bootstrap(Bootstrap::Prepare { .. })
        ),
        "without the marker, a fresh nonce is prepared"
    );
    for broken in [
        "formation marker /data/member/steward/formation.json: EOF while parsing a string at line 1 column 12",
        "formation marker /data/member/steward/formation.json: Input/output error (os error 5)",
    ] {
        f.data.unreadable_markers = vec![broken.into()];
        assert_waits(&decide(&f), &["formation.json", "a formation", "the data is kept"]);
    }
}

/// A decision journal, or a list of rejected snapshots, that cannot be read is not "empty":
/// init waits, naming the file (a recovery would be recorded again; a snapshot that failed
/// here chosen again).
#[test]
fn an_unreadable_journal_or_rejected_list_makes_init_wait_naming_it() {
    let mut f = Facts {
        recovery_request: Some(request_for(0)),
        ..survivor_facts(500)
    };
    f.data.unreadable_markers = vec![
        r#"decision journal "/data/member/steward/decisions.jsonl", line 2: not an entry of any release (expected value at line 1 column 1)"#.into(),
    ];
    assert_waits(
        &decide(&f),
        &["decisions.jsonl", "line 2", "what init already did"],
    );
    let mut f = facts();
    f.data.unreadable_markers = vec![
        "list of rejected snapshots /data/member/steward/rejected-snapshots.json: EOF while parsing a list".into(),
    ];
    assert_waits(
        &decide(&f),
        &["rejected-snapshots.json", "which snapshots failed here"],
    );
}

fn restore_request() -> RestoreRequest {
    RestoreRequest {
        id: "restore-1".into(),
        snapshot: "20261124T100000Z-r42".into(),
        expires_unix: u64::MAX,
    }
}

/// The store, as this pod listed it while a restore request names `names[0]`.
fn store_listing(names: &[&str]) -> BackupFacts {
    BackupFacts::Listed {
        wanted: RestoreWanted::Named(restore_request().snapshot),
        snapshots: names.iter().map(|n| snapshot(n, true)).collect(),
        keys: vec![],
    }
}

#[test]
fn a_restore_request_sets_a_live_members_data_aside_once() {
    let mut f = Facts {
        data: wal_of(0xa1, CLUSTER),
        restore_request: Some(restore_request()),
        backups: store_listing(&["20261124T100000Z-r42"]),
        ..facts()
    };
    f.cluster = healthy(vec![started_voter(0xa1, 1), started_voter(0xb2, 0)]);
    let d = decide(&f);
    assert_eq!(
        d.action,
        Action::SetAside {
            why: SetAsideWhy::RestoreRequested
        }
    );
    assert_reason(&d, &["set aside", "20261124T100000Z-r42"]);
    // Set aside and re-formed for this request: restarted normally, never set aside again.
    f.data.restored_for = Some("restore-1".into());
    assert_eq!(decide(&f).action, Action::Restart);
}

#[test]
fn a_restore_request_for_a_snapshot_this_pod_cannot_see_leaves_the_data_in_place() {
    let mut f = Facts {
        data: wal_of(0xa1, CLUSTER),
        restore_request: Some(restore_request()),
        ..facts()
    };
    f.cluster = healthy(vec![started_voter(0xa1, 1), started_voter(0xb2, 0)]);
    // The store does not list it, cannot be listed, or backups are not configured here.
    for backups in [
        store_listing(&["20261124T090000Z-r40"]),
        BackupFacts::Unreachable {
            error: "timed out".into(),
        },
        BackupFacts::Off,
    ] {
        let f = Facts {
            backups: backups.clone(),
            ..f.clone()
        };
        let d = decide(&f);
        assert_eq!(d.action, Action::Restart, "{backups:?}");
        assert_reason(&d, &["restore restore-1", "its data stays"]);
    }
}

#[test]
fn during_a_restore_an_empty_volume_never_joins_the_cluster_being_replaced() {
    let f = Facts {
        restore_request: Some(restore_request()),
        cluster: healthy_without_us(),
        ..with_peer(facts(), holding(0, 0xb2, CLUSTER))
    };
    let d = decide(&f);
    assert!(!matches!(d.action, Action::Join { .. }), "{d:?}");
    assert_waits(&d, &["restore restore-1", "the cluster being replaced"]);
    // Once no cluster answers, the formation's own rules: a peer still holds data.
    let f = Facts {
        cluster: not_reached(),
        ..f
    };
    assert_waits(&decide(&f), &["peers hold data"]);
}

// ---------------------------------------------------------------------------------------
// The volume holds data: only restart or set-aside, never a membership change.
// ---------------------------------------------------------------------------------------

#[test]
fn data_present_and_no_cluster_reached_restarts() {
    let f = Facts {
        data: wal_of(0xa1, CLUSTER),
        ..facts()
    };
    let d = decide(&f);
    assert_eq!(d.action, Action::Restart);
    assert_reason(&d, &["no live cluster"]);
}

#[test]
fn data_present_and_no_cluster_restarts_even_when_every_peer_is_unreachable() {
    let f = holding_with_peers(
        1,
        0xa1,
        CLUSTER,
        vec![unpublished_peer(0), unpublished_peer(2)],
    );
    assert_eq!(decide(&f).action, Action::Restart);
}

/// A peer whose volume holds member `member_id` of `cluster_id`.
fn holding(o: u32, member_id: u64, cluster_id: u64) -> PeerFacts {
    answering(
        o,
        PeerReport {
            has_data: true,
            wal: Some(WalIdentity {
                member_id,
                cluster_id,
            }),
            ..empty_report(o)
        },
    )
}

/// Pod `ordinal` holding member `member_id` of `cluster_id`, no cluster answering, and
/// these peers' reports.
fn holding_with_peers(
    ordinal: u32,
    member_id: u64,
    cluster_id: u64,
    peers: Vec<PeerFacts>,
) -> Facts {
    Facts {
        data: wal_of(member_id, cluster_id),
        peers,
        ..facts_for(ordinal)
    }
}

#[test]
fn data_outnumbered_by_another_clusters_volumes_waits_instead_of_starting_alone() {
    let f = holding_with_peers(
        1,
        0xf1,
        OTHER_CLUSTER,
        vec![holding(0, 0xa0, CLUSTER), holding(2, 0xa2, CLUSTER)],
    );
    assert_waits(
        &decide(&f),
        &["f04e16", "etcd-0, etcd-2", "c1a57e55", "set aside"],
    );
}

#[test]
fn data_shared_with_the_peers_restarts_without_a_cluster() {
    let f = holding_with_peers(
        1,
        0xa1,
        CLUSTER,
        vec![holding(0, 0xa0, CLUSTER), holding(2, 0xa2, CLUSTER)],
    );
    assert_eq!(decide(&f).action, Action::Restart);
}

#[test]
fn one_stray_volume_elsewhere_does_not_hold_back_a_restart() {
    // etcd-2 holds another cluster's data; etcd-0 holds ours: we are not the odd one out.
    let f = holding_with_peers(
        1,
        0xa1,
        CLUSTER,
        vec![holding(0, 0xa0, CLUSTER), holding(2, 0xf2, OTHER_CLUSTER)],
    );
    assert_eq!(decide(&f).action, Action::Restart);
    // And as etcd-2 sees it: two volumes of the other cluster against its one.
    let stray = holding_with_peers(
        2,
        0xf2,
        OTHER_CLUSTER,
        vec![holding(0, 0xa0, CLUSTER), holding(1, 0xa1, CLUSTER)],
    );
    assert_eq!(decide(&stray).action, Action::Wait);
}

#[test]
fn a_tie_between_clusters_restarts() {
    let f = holding_with_peers(
        1,
        0xa1,
        CLUSTER,
        vec![holding(0, 0xf0, OTHER_CLUSTER), empty_peer(2)],
    );
    assert_eq!(decide(&f).action, Action::Restart);
}

#[test]
fn data_of_a_member_the_healthy_cluster_lists_restarts() {
    let f = Facts {
        data: wal_of(0xa1, CLUSTER),
        cluster: healthy_with(started_voter(0xa1, 1)),
        ..facts()
    };
    let d = decide(&f);
    assert_eq!(d.action, Action::Restart);
    assert_reason(&d, &["a1", "lists"]);
}

#[test]
fn data_of_another_cluster_is_set_aside_as_foreign() {
    let f = Facts {
        data: wal_of(0xa1, OTHER_CLUSTER),
        cluster: healthy_with(started_voter(0xa1, 1)),
        ..facts()
    };
    let d = decide(&f);
    assert_eq!(
        d.action,
        Action::SetAside {
            why: SetAsideWhy::ForeignCluster
        }
    );
    assert_eq!(SetAsideWhy::ForeignCluster.slug(), "foreign-cluster");
    assert_reason(
        &d,
        &[&format!("{OTHER_CLUSTER:x}"), &format!("{CLUSTER:x}")],
    );
}

#[test]
fn data_of_a_member_no_longer_listed_is_set_aside_as_removed() {
    let f = Facts {
        data: wal_of(0xdead, CLUSTER),
        cluster: healthy_without_us(),
        ..facts()
    };
    let d = decide(&f);
    assert_eq!(
        d.action,
        Action::SetAside {
            why: SetAsideWhy::RemovedMember
        }
    );
    assert_eq!(SetAsideWhy::RemovedMember.slug(), "removed-member");
    assert_reason(&d, &["dead", "removed"]);
}

#[test]
fn data_of_a_removed_member_is_set_aside_even_if_a_new_member_holds_our_url() {
    // Our old member 0xdead was removed and a new entry for our URL was added since:
    // the WAL's member ID decides, not the URL.
    let f = Facts {
        data: wal_of(0xdead, CLUSTER),
        cluster: healthy_with(member(0xbeef, 1, "", true)),
        ..facts()
    };
    assert_eq!(
        decide(&f).action,
        Action::SetAside {
            why: SetAsideWhy::RemovedMember
        }
    );
}

/// A rebuild request for `member`, proven by a check of voters 0xa0, 0xa1, 0xa2 answering
/// `hashes` (in that order) at revision 40.
fn rebuild_request(member: u64, hashes: [u32; 3]) -> etcd_steward::facts::rebuild::RebuildRequest {
    use etcd_steward::facts::hashes::{judge, Answered, HashAnswer, HashCheck, HashRound};
    let answers: Vec<HashAnswer> = [0xa0, 0xa1, 0xa2]
        .into_iter()
        .zip(hashes)
        .map(|(member, hash)| HashAnswer {
            member,
            got: Answered::Hash {
                hash,
                compact_revision: 2,
            },
        })
        .collect();
    let verdict = judge(&HashRound {
        revision: 40,
        voters: vec![0xa0, 0xa1, 0xa2],
        answers: answers.clone(),
    });
    etcd_steward::facts::rebuild::RebuildRequest::new(
        member,
        HashCheck {
            at: 1_800_000_000,
            checker: 0xa0,
            answers,
            verdict,
        },
        u64::MAX,
    )
}

#[test]
fn a_listed_member_the_majoritys_hash_proves_diverged_sets_its_data_aside_then_replaces_itself() {
    let f = Facts {
        data: wal_of(0xa1, CLUSTER),
        cluster: healthy_with(started_voter(0xa1, 1)),
        rebuild_request: Some(rebuild_request(0xa1, [7, 9, 7])),
        ..facts()
    };
    let d = decide(&f);
    assert_eq!(
        d.action,
        Action::SetAside {
            why: SetAsideWhy::Diverged
        }
    );
    assert_eq!(SetAsideWhy::Diverged.slug(), "diverged");
    assert_reason(&d, &["a1", "diverged", "00000007", "not deleted"]);
    // The data is aside: the volume is empty, the cluster still lists the old member, which
    // is replaced (never reused: a new member ID).
    let after = Facts {
        data: DataDirState::empty(),
        ..f
    };
    assert!(
        matches!(decide(&after).action, Action::Replace { stale, .. } if stale.id == 0xa1),
        "{:?}",
        decide(&after)
    );
}

#[test]
fn a_rebuild_request_without_a_standing_proof_never_sets_a_listed_members_data_aside() {
    let listed = || Facts {
        data: wal_of(0xa1, CLUSTER),
        cluster: healthy_with(started_voter(0xa1, 1)),
        ..facts()
    };
    let restarts = |f: Facts, what: &str| {
        let d = decide(&f);
        assert_eq!(d.action, Action::Restart, "{what}: {d:?}");
    };
    // Three different hashes: no majority.
    restarts(
        Facts {
            rebuild_request: Some(rebuild_request(0xa1, [7, 9, 8])),
            ..listed()
        },
        "no majority",
    );
    // The proof names another member.
    restarts(
        Facts {
            rebuild_request: Some(rebuild_request(0xa2, [7, 7, 9])),
            ..listed()
        },
        "another member",
    );
    // Its verdict is not the one its answers give.
    let mut forged = rebuild_request(0xa1, [7, 9, 7]);
    forged.check.answers[1] = forged.check.answers[0].clone();
    forged.check.answers[1].member = 0xa1;
    restarts(
        Facts {
            rebuild_request: Some(forged),
            ..listed()
        },
        "a forged verdict",
    );
    // A voter joined since the check: its majority is another one's.
    let mut grown = listed();
    if let ClusterFacts::Healthy(v) = &mut grown.cluster {
        v.members.push(started_voter(0xa3, 3));
    }
    restarts(
        Facts {
            rebuild_request: Some(rebuild_request(0xa1, [7, 9, 7])),
            ..grown
        },
        "another membership",
    );
    // No cluster answers: the data stays, whatever the request says, and the diverged
    // member does not start on it again meanwhile.
    let d = decide(&Facts {
        cluster: not_reached(),
        rebuild_request: Some(rebuild_request(0xa1, [7, 9, 7])),
        ..listed()
    });
    assert_eq!(d.action, Action::Wait, "{d:?}");
    assert_reason(&d, &["a1", "rebuilt", "no live cluster"]);
    // A request about another member changes nothing here.
    let d = decide(&Facts {
        cluster: not_reached(),
        rebuild_request: Some(rebuild_request(0xa2, [7, 7, 9])),
        ..listed()
    });
    assert_eq!(d.action, Action::Restart, "{d:?}");
}

#[test]
fn unreadable_wal_with_our_peer_url_listed_restarts() {
    let f = Facts {
        data: unreadable_wal(),
        cluster: healthy_with(started_voter(0xa1, 1)),
        ..facts()
    };
    let d = decide(&f);
    assert_eq!(d.action, Action::Restart);
    assert_reason(&d, &["could not be read", "lists this pod's peer URL"]);
}

#[test]
fn unreadable_wal_not_listed_is_set_aside_as_not_a_member() {
    let f = Facts {
        data: unreadable_wal(),
        cluster: healthy_without_us(),
        ..facts()
    };
    let d = decide(&f);
    assert_eq!(
        d.action,
        Action::SetAside {
            why: SetAsideWhy::NotAMember
        }
    );
    assert_eq!(SetAsideWhy::NotAMember.slug(), "not-a-member");
    assert_reason(&d, &["no member at this pod's peer URL"]);
}

#[test]
fn unreadable_wal_listed_only_by_name_is_set_aside() {
    // Data is matched by peer URL: a member named like us at another URL is not ours.
    let mut elsewhere = started_voter(0xa1, 1);
    elsewhere.peer_urls = vec!["http://10.9.9.9:2380".into()];
    let f = Facts {
        data: unreadable_wal(),
        cluster: healthy_with(elsewhere),
        ..facts()
    };
    assert_eq!(
        decide(&f).action,
        Action::SetAside {
            why: SetAsideWhy::NotAMember
        }
    );
}

// ---------------------------------------------------------------------------------------
// Empty volume, healthy cluster: join, resume a never-started entry, or replace.
// ---------------------------------------------------------------------------------------

#[test]
fn empty_dir_and_healthy_cluster_without_us_joins() {
    let f = Facts {
        cluster: healthy_without_us(),
        ..facts()
    };
    let d = decide(&f);
    assert_eq!(d.action, Action::Join { via: via() });
    assert_reason(&d, &[&format!("{CLUSTER:x}"), "learner"]);
}

#[test]
fn empty_dir_listed_as_never_started_learner_resumes_it() {
    let f = Facts {
        cluster: healthy_with(member(0xb1, 1, "", true)),
        ..facts()
    };
    let d = decide(&f);
    assert!(matches!(
        d.action,
        Action::Resume {
            member_id: 0xb1,
            ..
        }
    ));
    assert_reason(&d, &["b1", "never started"]);
}

#[test]
fn empty_dir_with_stale_started_learner_is_replaced() {
    let stale = member(0xb1, 1, "etcd-1", true);
    let f = Facts {
        cluster: healthy_with(stale.clone()),
        ..facts()
    };
    let d = decide(&f);
    assert_eq!(d.action, Action::Replace { stale, via: via() });
    assert_reason(&d, &["learner b1", "never with the old member ID"]);
}

#[test]
fn empty_dir_with_stale_member_is_replaced() {
    let stale = started_voter(0xa1, 1);
    let f = Facts {
        cluster: healthy_with(stale.clone()),
        ..facts()
    };
    let d = decide(&f);
    assert_eq!(d.action, Action::Replace { stale, via: via() });
    assert_reason(&d, &["voter a1", "never with the old member ID"]);
}

#[test]
fn empty_dir_with_started_member_is_replaced_even_with_our_formation_marker() {
    // The marker proves we took part in forming the cluster, but the member started and
    // its log is gone with the old volume: reusing its ID would fake a log we lack.
    let stale = started_voter(0xa1, 1);
    let f = with_marker(
        Facts {
            cluster: healthy_with(stale.clone()),
            ..facts()
        },
        marker_with_token("n1", "n0.n1.n2"),
    );
    assert_eq!(decide(&f).action, Action::Replace { stale, via: via() });
}

#[test]
fn empty_dir_with_stale_member_found_by_name_at_another_url_is_replaced() {
    let mut stale = started_voter(0xa1, 1);
    stale.peer_urls = vec!["http://10.9.9.9:2380".into()];
    let f = Facts {
        cluster: healthy_with(stale.clone()),
        ..facts()
    };
    assert_eq!(decide(&f).action, Action::Replace { stale, via: via() });
}

#[test]
fn never_started_voter_with_our_formation_marker_resumes() {
    let f = with_marker(
        Facts {
            cluster: healthy_with(member(0xa1, 1, "", false)),
            ..facts()
        },
        marker_with_token("n1", "n0.n1.n2"),
    );
    let d = decide(&f);
    assert!(matches!(
        d.action,
        Action::Resume {
            member_id: 0xa1,
            ..
        }
    ));
    assert_reason(&d, &["a1", "formation", "marker"]);
}

#[test]
fn formation_voter_named_by_initial_cluster_but_never_started_resumes_with_our_marker() {
    // Members created by --initial-cluster carry their names from the start; only their
    // client URLs show whether they ever ran. A pod that slept through its own formation
    // must come back as that member, not remove it.
    let mut m = started_voter(0xb2, 1);
    m.client_urls.clear();
    let f = with_marker(
        Facts {
            cluster: healthy_with(m),
            ..facts()
        },
        marker("n1"),
    );
    assert!(matches!(
        decide(&f).action,
        Action::Resume {
            member_id: 0xb2,
            ..
        }
    ));
}

#[test]
fn never_started_voter_without_our_formation_marker_is_replaced() {
    let stale = member(0xa1, 1, "", false);
    let f = Facts {
        cluster: healthy_with(stale.clone()),
        ..facts()
    };
    let d = decide(&f);
    assert_eq!(d.action, Action::Replace { stale, via: via() });
    assert_reason(&d, &["voter a1"]);
}

#[test]
fn healthy_cluster_never_leads_to_bootstrap_even_with_our_token() {
    let f = with_marker(
        Facts {
            cluster: healthy_without_us(),
            ..facts()
        },
        marker_with_token("n1", "n0.n1.n2"),
    );
    assert_eq!(decide(&f).action, Action::Join { via: via() });
}

// ---------------------------------------------------------------------------------------
// Empty volume, no cluster: form one only with proof that none exists.
// ---------------------------------------------------------------------------------------

#[test]
fn every_initial_peer_empty_and_no_marker_prepares_a_formation() {
    let d = decide(&facts());
    assert_eq!(
        d.action,
        Action::Bootstrap(Bootstrap::Prepare {
            marker: Formation {
                nonce: "fresh".into(),
                initial_cluster: initial_cluster(REPLICAS),
                token: None,
                snapshot: None,
            },
        })
    );
    assert_reason(&d, &["every initial peer answered with an empty volume"]);
}

#[test]
fn a_single_pod_set_prepares_without_any_peer() {
    let mut f = facts_for(0);
    f.replicas = 1;
    f.initial_cluster = initial_cluster(1);
    f.peers = vec![];
    assert!(matches!(
        decide(&f).action,
        Action::Bootstrap(Bootstrap::Prepare { .. })
    ));
}

#[test]
fn an_initial_peer_whose_dns_is_not_published_makes_us_wait() {
    let f = with_peer(facts(), unpublished_peer(2));
    assert_waits(&decide(&f), &["etcd-2", "not published"]);
}

#[test]
fn an_initial_peer_whose_dns_lookup_fails_makes_us_wait() {
    let f = with_peer(
        facts(),
        PeerFacts {
            dns: Lookup::Failed("SERVFAIL".into()),
            report: None,
            ..empty_peer(0)
        },
    );
    assert_waits(&decide(&f), &["etcd-0", "SERVFAIL"]);
}

#[test]
fn an_initial_peer_whose_sidecar_does_not_answer_makes_us_wait() {
    let f = with_peer(
        facts(),
        PeerFacts {
            report: Some(Err("connection refused".into())),
            ..empty_peer(2)
        },
    );
    assert_waits(&decide(&f), &["etcd-2", "connection refused"]);
}

#[test]
fn an_initial_peer_not_asked_makes_us_wait() {
    let f = with_peer(
        facts(),
        PeerFacts {
            report: None,
            ..empty_peer(0)
        },
    );
    assert_waits(&decide(&f), &["etcd-0", "not asked"]);
}

#[test]
fn an_unreachable_peer_blocks_the_start_of_a_prepared_formation_too() {
    let f = with_peer(
        with_marker(with_peer(facts(), prepared_peer(0, "n0")), marker("n1")),
        PeerFacts {
            report: Some(Err("timed out".into())),
            ..prepared_peer(2, "n2")
        },
    );
    assert_waits(&decide(&f), &["etcd-2", "timed out"]);
}

#[test]
fn a_later_pod_not_yet_published_does_not_block_formation() {
    // etcd-3 is beyond the initial size: its absence is normal during a first start.
    let f = with_peer(facts(), unpublished_peer(3));
    assert!(matches!(
        decide(&f).action,
        Action::Bootstrap(Bootstrap::Prepare { .. })
    ));
}

#[test]
fn a_later_pod_holding_data_makes_us_wait() {
    let f = with_peer(facts(), started_peer(3, 0xa3, None));
    assert_waits(&decide(&f), &["etcd-3", "a3"]);
}

#[test]
fn a_peer_with_data_makes_us_wait_when_we_have_no_marker() {
    // Its etcd is down (no cluster answered), but its WAL proves a cluster exists.
    let f = with_peer(
        facts(),
        started_peer(0, 0xa0, Some(marker_with_token("x", "x.y.z"))),
    );
    let d = decide(&f);
    assert_waits(
        &d,
        &["etcd-0", "member a0", &format!("cluster {CLUSTER:x}")],
    );
    assert!(matches!(f.cluster, ClusterFacts::NotReached { .. }));
}

#[test]
fn a_peer_with_unreadable_wal_makes_us_wait() {
    let f = with_peer(
        facts(),
        answering(
            2,
            PeerReport {
                has_data: true,
                wal_error: Some("garbage".into()),
                ..empty_report(2)
            },
        ),
    );
    assert_waits(&decide(&f), &["etcd-2 (WAL unreadable)"]);
}

#[test]
fn every_initial_pod_prepared_alike_starts_with_nonces_in_ordinal_order() {
    // Peers listed out of order: the token follows ordinals, not the list.
    let mut f = with_marker(facts(), marker("n1"));
    f.peers = vec![prepared_peer(2, "n2"), prepared_peer(0, "n0")];
    let d = decide(&f);
    assert_starts(&d, marker_with_token("n1", "n0.n1.n2"));
    assert_reason(&d, &["n0.n1.n2"]);
}

#[test]
fn the_token_is_the_same_whichever_pod_computes_it() {
    let tokens: Vec<Action> = (0..REPLICAS)
        .map(|me| {
            let mut f = with_marker(facts_for(me), marker(&format!("n{me}")));
            f.peers = (0..REPLICAS)
                .filter(|o| *o != me)
                .map(|o| prepared_peer(o, &format!("n{o}")))
                .collect();
            decide(&f).action
        })
        .collect();
    for (me, action) in tokens.iter().enumerate() {
        assert_eq!(
            *action,
            Action::Bootstrap(Bootstrap::Start {
                nonce: format!("n{me}"),
                initial_cluster: initial_cluster(REPLICAS),
                token: "n0.n1.n2".into(),
                snapshot: None,
            })
        );
    }
}

#[test]
fn a_peer_prepared_with_a_different_initial_cluster_makes_us_wait() {
    let other = Formation {
        nonce: "n2".into(),
        initial_cluster: initial_cluster(5),
        token: None,
        snapshot: None,
    };
    let f = with_peer(
        with_marker(with_peer(facts(), prepared_peer(0, "n0")), marker("n1")),
        answering(
            2,
            PeerReport {
                formation: Some(other),
                ..empty_report(2)
            },
        ),
    );
    let d = decide(&f);
    assert_waits(&d, &["etcd-2", "different initial cluster", "etcd-4="]);
}

#[test]
fn an_unprepared_peer_makes_us_wait() {
    let f = with_marker(with_peer(facts(), prepared_peer(0, "n0")), marker("n1"));
    let d = decide(&f);
    assert_waits(&d, &["waiting for etcd-2 to prepare"]);
    assert!(!d.reason().contains("etcd-0"), "{}", d.reason());
}

#[test]
fn our_marker_with_a_token_starts_with_it() {
    // We already decided to start; peers may be gone meanwhile (they started etcd, which
    // is not answering yet, or they restart): the decision stands.
    let mut f = with_marker(facts(), marker_with_token("n1", "n0.n1.n2"));
    f.peers = vec![unpublished_peer(0), unpublished_peer(2)];
    let d = decide(&f);
    assert_starts(&d, marker_with_token("n1", "n0.n1.n2"));
    assert_reason(&d, &["n0.n1.n2"]);
}

#[test]
fn a_peer_started_with_a_token_that_includes_our_nonce_lets_us_start_too() {
    // A half-started formation: etcd-0 computed the token and started before we did.
    let f = with_marker(
        with_peer(
            with_peer(
                facts(),
                started_peer(0, 0xa0, Some(marker_with_token("n0", "n0.n1.n2"))),
            ),
            prepared_peer(2, "n2"),
        ),
        marker("n1"),
    );
    let d = decide(&f);
    assert_starts(&d, marker_with_token("n1", "n0.n1.n2"));
    assert_reason(&d, &["etcd-0", "n0.n1.n2"]);
}

#[test]
fn a_half_started_formation_is_recognised_even_if_another_peer_is_unreachable() {
    let f = with_marker(
        with_peer(
            with_peer(
                facts(),
                started_peer(0, 0xa0, Some(marker_with_token("n0", "n0.n1.n2"))),
            ),
            unpublished_peer(2),
        ),
        marker("n1"),
    );
    assert_starts(&decide(&f), marker_with_token("n1", "n0.n1.n2"));
}

#[test]
fn a_peer_started_with_a_token_without_our_nonce_makes_us_wait() {
    let f = with_marker(
        with_peer(
            facts(),
            started_peer(0, 0xa0, Some(marker_with_token("n0", "n0.old.n2"))),
        ),
        marker("n1"),
    );
    assert_waits(&decide(&f), &["etcd-0", "did not form with"]);
}

#[test]
fn a_peer_started_with_our_nonce_at_another_ordinal_makes_us_wait() {
    let f = with_marker(
        with_peer(
            facts(),
            started_peer(0, 0xa0, Some(marker_with_token("n0", "n0.n2.n1"))),
        ),
        marker("n1"),
    );
    assert_waits(&decide(&f), &["etcd-0"]);
}

#[test]
fn a_peer_started_with_our_nonce_but_another_initial_cluster_makes_us_wait() {
    let theirs = Formation {
        initial_cluster: initial_cluster(5),
        ..marker_with_token("n0", "n0.n1.n2.n3.n4")
    };
    let f = with_marker(
        with_peer(facts(), started_peer(0, 0xa0, Some(theirs))),
        marker("n1"),
    );
    assert_waits(&decide(&f), &["etcd-0"]);
}

#[test]
fn one_started_peer_without_our_nonce_makes_us_wait_even_if_another_has_it() {
    let f = with_marker(
        with_peer(
            with_peer(
                facts(),
                started_peer(0, 0xa0, Some(marker_with_token("n0", "n0.n1.n2"))),
            ),
            started_peer(2, 0xa2, None),
        ),
        marker("n1"),
    );
    assert_waits(&decide(&f), &["etcd-2"]);
}

#[test]
fn our_marker_prepared_for_another_initial_cluster_is_prepared_afresh() {
    // Prepared as one of five; the set was then scaled to three before every pod
    // prepared. Pods 0-2 all hold the five-member marker, so they agree with each other,
    // but starting would form a five-voter cluster with two voters that never exist: no
    // fault tolerance, and nothing says why.
    let five = Formation {
        initial_cluster: initial_cluster(5),
        ..marker("n1")
    };
    let peer_five = |o: u32| {
        answering(
            o,
            PeerReport {
                formation: Some(Formation {
                    nonce: format!("n{o}"),
                    ..five.clone()
                }),
                ..empty_report(o)
            },
        )
    };
    let mut f = with_marker(facts(), five.clone());
    f.peers = vec![peer_five(0), peer_five(2)];
    let d = decide(&f);
    assert!(
        !matches!(d.action, Action::Bootstrap(Bootstrap::Start { .. })),
        "started with {:?}: {}",
        d.action,
        d.reason()
    );
    match &d.action {
        Action::Bootstrap(Bootstrap::Prepare { marker }) => {
            assert_eq!(
                marker.initial_cluster, f.initial_cluster,
                "prepared for the configured size"
            );
        }
        other => panic!("expected a fresh prepare, got {other:?}: {}", d.reason()),
    }
}

#[test]
fn an_ordinal_beyond_the_initial_size_waits_when_no_cluster_answers() {
    let mut f = facts_for(3);
    f.peers = (0..REPLICAS).map(empty_peer).collect();
    let d = decide(&f);
    assert_waits(
        &d,
        &["ordinal 3", "initial cluster size 3", "connection refused"],
    );
}

#[test]
fn an_ordinal_beyond_the_initial_size_joins_a_healthy_cluster() {
    let f = Facts {
        cluster: healthy(vec![
            started_voter(0xa0, 0),
            started_voter(0xa1, 1),
            started_voter(0xa2, 2),
        ]),
        ..facts_for(3)
    };
    assert_eq!(decide(&f).action, Action::Join { via: via() });
}

// ---------------------------------------------------------------------------------------
// Every volume lost: a new cluster starts from the newest usable backup, never empty in
// its place.
// ---------------------------------------------------------------------------------------

fn snapshot(name: &str, verified: bool) -> SnapshotFacts {
    SnapshotFacts {
        name: name.into(),
        revision: 42,
        time_unix: 1_700_000_000,
        verified,
        drill_failed: false,
        content: content("etag-1"),
        key: None,
        archive: None,
    }
}

/// A stored object as the store lists it (the manifest's SHA-256, its size and ETag).
fn content(etag: &str) -> SnapshotContent {
    SnapshotContent {
        sha256: "5ca1ab1e".into(),
        size: Some(4096),
        etag: Some(etag.into()),
    }
}

fn with_backups(mut f: Facts, snapshots: Vec<SnapshotFacts>) -> Facts {
    f.backups = BackupFacts::Listed {
        wanted: RestoreWanted::Latest,
        snapshots,
        keys: vec![],
    };
    f
}

fn marker_for(nonce: &str, snapshot: &str) -> Formation {
    Formation {
        snapshot: Some(snapshot.into()),
        ..marker(nonce)
    }
}

fn prepared_peer_for(o: u32, nonce: &str, snapshot: &str) -> PeerFacts {
    answering(
        o,
        PeerReport {
            formation: Some(marker_for(nonce, snapshot)),
            ..empty_report(o)
        },
    )
}

fn prepared_snapshot(d: &Decision) -> Option<Option<String>> {
    match &d.action {
        Action::Bootstrap(Bootstrap::Prepare { marker }) => Some(marker.snapshot.clone()),
        _ => None,
    }
}

#[test]
fn every_volume_empty_with_backups_prepares_to_restore_the_newest() {
    let f = with_backups(facts(), vec![snapshot("new", true), snapshot("old", true)]);
    let d = decide(&f);
    assert_eq!(
        prepared_snapshot(&d),
        Some(Some("new".into())),
        "{}",
        d.reason()
    );
    assert_reason(&d, &["restored from backup new"]);
}

#[test]
fn segments_continuing_the_newest_snapshot_make_the_restore_point_the_archives_end() {
    let mut newest = snapshot("new", true);
    newest.archive = Some(ArchiveReach {
        last_revision: 97,
        last_time_unix_ms: 1_700_000_100_000,
        segments: 3,
        broken: None,
    });
    let f = with_backups(facts(), vec![newest.clone(), snapshot("old", true)]);
    assert_eq!(prepared_snapshot(&decide(&f)), Some(Some("new+r97".into())));
    assert_eq!(
        parse_restore_point("new+r97"),
        ("new", Some(PointAt::Revision(97)))
    );
    // A chain that reaches no further than the snapshot is the snapshot alone.
    if let Some(a) = newest.archive.as_mut() {
        a.last_revision = newest.revision;
    }
    let f = with_backups(facts(), vec![newest]);
    assert_eq!(prepared_snapshot(&decide(&f)), Some(Some("new".into())));
}

#[test]
fn a_restore_to_a_revision_takes_the_newest_snapshot_before_it_and_refuses_outside_the_range() {
    let mut newest = snapshot("new", true);
    newest.revision = 50;
    newest.archive = Some(ArchiveReach {
        last_revision: 97,
        last_time_unix_ms: 1_700_000_100_000,
        segments: 3,
        broken: None,
    });
    let mut older = snapshot("old", true);
    older.revision = 20;
    let at = |n: i64| {
        let mut f = with_backups(facts(), vec![newest.clone(), older.clone()]);
        if let BackupFacts::Listed { wanted, .. } = &mut f.backups {
            *wanted = RestoreWanted::Revision(n);
        }
        decide(&f)
    };
    assert_eq!(prepared_snapshot(&at(60)), Some(Some("new+r60".into())));
    assert_eq!(prepared_snapshot(&at(50)), Some(Some("new".into())));
    assert_eq!(prepared_snapshot(&at(20)), Some(Some("old".into())));
    // Between the older snapshot and the newer one, no archive continues the older.
    for outside in [30, 98, 5] {
        let d = at(outside);
        assert_eq!(prepared_snapshot(&d), None, "{}", d.reason());
        assert_reason(
            &d,
            &["outside the restorable range (revision 20 (snapshot old) to revision 97)"],
        );
    }
}

#[test]
fn a_restore_to_a_time_names_the_point_by_the_moment_and_refuses_outside_the_range() {
    // "new": taken at 1_700_000_000 s (revision 50), archived up to 100 s later;
    // "old": taken 1000 s earlier, no archive.
    let mut newest = snapshot("new", true);
    newest.revision = 50;
    newest.archive = Some(ArchiveReach {
        last_revision: 97,
        last_time_unix_ms: 1_700_000_100_000,
        segments: 3,
        broken: None,
    });
    let mut older = snapshot("old", true);
    older.revision = 20;
    older.time_unix = 1_699_999_000;
    let at = |ms: u64| {
        let mut f = with_backups(facts(), vec![newest.clone(), older.clone()]);
        if let BackupFacts::Listed { wanted, .. } = &mut f.backups {
            *wanted = RestoreWanted::Time(ms);
        }
        decide(&f)
    };
    assert_eq!(
        prepared_snapshot(&at(1_700_000_059_999)),
        Some(Some("new+t1700000059999".into()))
    );
    assert_eq!(
        parse_restore_point("new+t1700000059999"),
        (
            "new",
            Some(PointAt::Time {
                unix_ms: 1_700_000_059_999
            })
        )
    );
    // The archive's last moment is still inside; the older snapshot's own moment too.
    assert_eq!(
        prepared_snapshot(&at(1_700_000_100_000)),
        Some(Some("new+t1700000100000".into()))
    );
    assert_eq!(
        prepared_snapshot(&at(1_699_999_000_000)),
        Some(Some("old+t1699999000000".into()))
    );
    // After the archive's end, before the oldest snapshot, and between the older snapshot
    // and the newer one (no archive continues the older): refused, with the range.
    for outside in [1_700_000_100_001, 1_699_998_999_999, 1_699_999_500_000] {
        let d = at(outside);
        assert_eq!(prepared_snapshot(&d), None, "{}", d.reason());
        assert_reason(
            &d,
            &["outside the restorable range (2023-11-14T21:56:40.000Z (snapshot old) to 2023-11-14T22:15:00.000Z)"],
        );
    }
    // A point named by an operator's request is accepted inside its snapshot's reach only.
    let named = |name: &str| {
        let mut f = with_backups(facts(), vec![newest.clone(), older.clone()]);
        if let BackupFacts::Listed { wanted, .. } = &mut f.backups {
            *wanted = RestoreWanted::Named(name.into());
        }
        decide(&f)
    };
    assert_eq!(
        prepared_snapshot(&named("new+t1700000050000")),
        Some(Some("new+t1700000050000".into()))
    );
    assert_eq!(
        prepared_snapshot(&named("new+r60")),
        Some(Some("new+r60".into()))
    );
    for beyond in ["new+t1700000100001", "new+r98", "old+r21"] {
        let d = named(beyond);
        assert_eq!(prepared_snapshot(&d), None, "{}", d.reason());
        assert_reason(&d, &["outside the restorable range"]);
    }
}

#[test]
fn a_newest_snapshot_that_failed_its_checksum_is_skipped_for_the_next() {
    let f = with_backups(
        facts(),
        vec![snapshot("bad", false), snapshot("good", true)],
    );
    assert_eq!(prepared_snapshot(&decide(&f)), Some(Some("good".into())));
}

#[test]
fn a_snapshot_that_failed_its_drill_is_skipped() {
    let mut drilled_bad = snapshot("bad", true);
    drilled_bad.drill_failed = true;
    let f = with_backups(facts(), vec![drilled_bad, snapshot("good", true)]);
    assert_eq!(prepared_snapshot(&decide(&f)), Some(Some("good".into())));
}

#[test]
fn a_snapshot_this_pod_found_corrupt_on_download_is_skipped() {
    let mut f = with_backups(
        facts(),
        vec![snapshot("torn", true), snapshot("good", true)],
    );
    f.data.rejected_snapshots.push(Rejection {
        name: "torn".into(),
        failed: Failed::Checksum {
            content: content("etag-1"),
            detail: "sha256 mismatch".into(),
        },
    });
    assert_eq!(prepared_snapshot(&decide(&f)), Some(Some("good".into())));
}

/// With the configured keys `keys`, one encrypted snapshot `s1` (to key `sha256:right`).
fn encrypted_backup(keys: &[&str]) -> Facts {
    let mut s1 = snapshot("s1", true);
    s1.key = Some("sha256:right".into());
    let mut f = facts();
    f.backups = BackupFacts::Listed {
        wanted: RestoreWanted::Latest,
        snapshots: vec![s1],
        keys: {
            // As the observer gives them: sorted.
            let mut keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            keys.sort();
            keys
        },
    };
    f
}

fn no_key_opened_it(configured: &[&str]) -> Rejection {
    Rejection {
        name: "s1".into(),
        failed: Failed::Key {
            content: content("etag-1"),
            encrypted_to: "sha256:right".into(),
            configured: configured.iter().map(|k| k.to_string()).collect(),
        },
    }
}

#[test]
fn a_snapshot_no_key_opened_is_still_skipped_with_the_same_keys_and_the_reason_names_them() {
    let mut f = encrypted_backup(&["sha256:wrong", "sha256:older"]);
    f.data.rejected_snapshots = vec![no_key_opened_it(&["sha256:older", "sha256:wrong"])];
    let d = decide(&f);
    assert_waits(
        &d,
        &[
            "s1 is encrypted to key sha256:right",
            "the keys configured now (sha256:older, sha256:wrong) do not open it",
            "tried again once the configured keys change",
        ],
    );
    assert!(!d.reason().contains("checksum"), "{}", d.reason());
}

#[test]
fn a_snapshot_no_key_opened_is_tried_again_once_the_keys_change() {
    let mut f = encrypted_backup(&["sha256:right"]);
    f.data.rejected_snapshots = vec![no_key_opened_it(&["sha256:wrong"])];
    assert_eq!(prepared_snapshot(&decide(&f)), Some(Some("s1".into())));
    // A key added beside the wrong one is a change too.
    let mut f = encrypted_backup(&["sha256:right", "sha256:wrong"]);
    f.data.rejected_snapshots = vec![no_key_opened_it(&["sha256:wrong"])];
    assert_eq!(prepared_snapshot(&decide(&f)), Some(Some("s1".into())));
}

#[test]
fn an_encrypted_snapshot_tried_without_keys_is_tried_again_once_a_key_is_configured() {
    let mut f = encrypted_backup(&[]);
    f.data.rejected_snapshots = vec![no_key_opened_it(&[])];
    assert_waits(&decide(&f), &["the keys configured now (none)"]);
    let mut f = encrypted_backup(&["sha256:right"]);
    f.data.rejected_snapshots = vec![no_key_opened_it(&[])];
    assert_eq!(prepared_snapshot(&decide(&f)), Some(Some("s1".into())));
}

#[test]
fn a_re_uploaded_object_that_failed_its_checksum_is_tried_again() {
    let torn = Rejection {
        name: "s1".into(),
        failed: Failed::Checksum {
            content: content("etag-1"),
            detail: "the stored object differs from its manifest".into(),
        },
    };
    let mut f = with_backups(facts(), vec![snapshot("s1", true)]);
    f.data.rejected_snapshots = vec![torn.clone()];
    assert_waits(
        &decide(&f),
        &[
            "s1 failed its checksum when this pod downloaded it",
            "differs from its manifest",
        ],
    );
    // The same name, uploaded again: another ETag.
    let mut again = snapshot("s1", true);
    again.content = content("etag-2");
    let mut f = with_backups(facts(), vec![again]);
    f.data.rejected_snapshots = vec![torn.clone()];
    assert_eq!(prepared_snapshot(&decide(&f)), Some(Some("s1".into())));
    // The manifest rewritten (another SHA-256), the object's listing unchanged.
    let mut rewritten = snapshot("s1", true);
    rewritten.content.sha256 = "f00d".into();
    let mut f = with_backups(facts(), vec![rewritten]);
    f.data.rejected_snapshots = vec![torn];
    assert_eq!(prepared_snapshot(&decide(&f)), Some(Some("s1".into())));
}

#[test]
fn a_rejection_an_older_version_recorded_by_name_only_is_tried_once_more() {
    let mut f = with_backups(facts(), vec![snapshot("s1", true)]);
    f.data.rejected_snapshots = vec![Rejection {
        name: "s1".into(),
        failed: Failed::Unrecorded {
            detail: "snapshot s1 fails its checksum: sha256 mismatch".into(),
        },
    }];
    assert_eq!(prepared_snapshot(&decide(&f)), Some(Some("s1".into())));
}

#[test]
fn a_named_snapshot_no_key_opened_waits_naming_the_keys_not_a_checksum() {
    let mut f = encrypted_backup(&["sha256:wrong"]);
    if let BackupFacts::Listed { wanted, .. } = &mut f.backups {
        *wanted = RestoreWanted::Named("s1".into());
    }
    f.data.rejected_snapshots = vec![no_key_opened_it(&["sha256:wrong"])];
    let d = decide(&f);
    assert_waits(&d, &["--restore names snapshot s1", "sha256:wrong"]);
    assert!(!d.reason().contains("checksum"), "{}", d.reason());
}

#[test]
fn backups_that_exist_but_none_usable_make_us_wait_never_form_empty() {
    let f = with_backups(
        facts(),
        vec![snapshot("bad-1", false), snapshot("bad-2", false)],
    );
    assert_waits(
        &decide(&f),
        &["none is usable", "bad-1", "bad-2", "--restore never"],
    );
}

#[test]
fn an_unreachable_backup_store_makes_us_wait_never_form_empty() {
    let mut f = facts();
    f.backups = BackupFacts::Unreachable {
        error: "connection refused".into(),
    };
    assert_waits(
        &decide(&f),
        &["backup store cannot be listed", "connection refused"],
    );
}

#[test]
fn an_empty_backup_store_forms_an_empty_cluster() {
    let f = with_backups(facts(), vec![]);
    assert_eq!(prepared_snapshot(&decide(&f)), Some(None));
}

#[test]
fn a_named_snapshot_is_restored_and_a_missing_one_makes_us_wait() {
    let mut f = with_backups(facts(), vec![snapshot("new", true), snapshot("old", true)]);
    f.backups = BackupFacts::Listed {
        wanted: RestoreWanted::Named("old".into()),
        snapshots: vec![snapshot("new", true), snapshot("old", true)],
        keys: vec![],
    };
    assert_eq!(prepared_snapshot(&decide(&f)), Some(Some("old".into())));
    f.backups = BackupFacts::Listed {
        wanted: RestoreWanted::Named("gone".into()),
        snapshots: vec![snapshot("new", true)],
        keys: vec![],
    };
    assert_waits(&decide(&f), &["gone", "not in the store"]);
}

#[test]
fn every_pod_prepared_for_the_same_snapshot_starts_restoring_it() {
    let mut f = with_backups(facts(), vec![snapshot("s1", true)]);
    f = with_marker(f, marker_for("n1", "s1"));
    f.peers = vec![
        prepared_peer_for(0, "n0", "s1"),
        prepared_peer_for(2, "n2", "s1"),
    ];
    let d = decide(&f);
    assert_eq!(
        d.action,
        Action::Bootstrap(Bootstrap::Start {
            nonce: "n1".into(),
            initial_cluster: initial_cluster(REPLICAS),
            token: "n0.n1.n2".into(),
            snapshot: Some("s1".into()),
        }),
        "{}",
        d.reason()
    );
}

#[test]
fn a_peer_prepared_for_another_snapshot_makes_us_wait() {
    let mut f = with_backups(facts(), vec![snapshot("s1", true)]);
    f = with_marker(f, marker_for("n1", "s1"));
    f.peers = vec![
        prepared_peer_for(0, "n0", "s1"),
        prepared_peer_for(2, "n2", "s0"),
    ];
    assert_waits(&decide(&f), &["etcd-2", "snapshot s0", "snapshot s1"]);
}

#[test]
fn our_marker_prepared_for_a_snapshot_no_longer_chosen_is_prepared_afresh() {
    let mut f = with_backups(facts(), vec![snapshot("s2", true), snapshot("s1", true)]);
    f = with_marker(f, marker_for("n1", "s1"));
    assert_eq!(prepared_snapshot(&decide(&f)), Some(Some("s2".into())));
}

#[test]
fn an_agreed_restore_is_finished_after_a_kill() {
    let f = with_marker(
        with_backups(facts(), vec![]),
        Formation {
            token: Some("n0.n1.n2".into()),
            ..marker_for("n1", "s1")
        },
    );
    match decide(&f).action {
        Action::Bootstrap(Bootstrap::Start { snapshot, .. }) => {
            assert_eq!(snapshot.as_deref(), Some("s1"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_volume_with_data_is_never_restored_over() {
    let mut f = with_backups(facts(), vec![snapshot("s1", true)]);
    f.data = wal_of(0xa1, CLUSTER);
    assert_eq!(decide(&f).action, Action::Restart);
}

#[test]
fn a_surviving_volume_elsewhere_means_no_restore() {
    // Two volumes lost, one survives: its data is newer than any backup.
    let f = with_peer(
        with_backups(facts(), vec![snapshot("s1", true)]),
        started_peer(0, 0xa0, None),
    );
    let d = decide(&f);
    assert_eq!(prepared_snapshot(&d), None);
    assert_waits(&d, &["etcd-0"]);
}

// ---------------------------------------------------------------------------------------
// Our own DNS name: etcd refuses to start before it resolves.
// ---------------------------------------------------------------------------------------

fn unpublished_self(f: Facts) -> Facts {
    Facts {
        own_dns: Lookup::NotFound,
        ..f
    }
}

#[track_caller]
fn assert_held_back(f: Facts, decided: &str) {
    let published = decide(&f);
    assert_eq!(published.action.name(), decided, "{}", published.reason());
    let d = decide(&unpublished_self(f));
    assert_waits(
        &d,
        &[&host(1), "not published", &format!("decided: {decided}")],
    );
}

#[test]
fn own_dns_unpublished_holds_back_a_restart() {
    assert_held_back(
        Facts {
            data: wal_of(0xa1, CLUSTER),
            ..facts()
        },
        "restart",
    );
}

#[test]
fn own_dns_unpublished_holds_back_a_join() {
    assert_held_back(
        Facts {
            cluster: healthy_without_us(),
            ..facts()
        },
        "join",
    );
}

#[test]
fn own_dns_unpublished_holds_back_a_resume() {
    assert_held_back(
        Facts {
            cluster: healthy_with(member(0xb1, 1, "", true)),
            ..facts()
        },
        "resume",
    );
}

#[test]
fn own_dns_unpublished_holds_back_a_replace() {
    assert_held_back(
        Facts {
            cluster: healthy_with(started_voter(0xa1, 1)),
            ..facts()
        },
        "replace",
    );
}

#[test]
fn own_dns_unpublished_holds_back_a_bootstrap_start() {
    assert_held_back(
        with_marker(facts(), marker_with_token("n1", "n0.n1.n2")),
        "bootstrap",
    );
}

#[test]
fn own_dns_failing_holds_back_a_join_and_says_why() {
    let f = Facts {
        cluster: healthy_without_us(),
        own_dns: Lookup::Failed("i/o timeout".into()),
        ..facts()
    };
    assert_waits(&decide(&f), &[&host(1), "i/o timeout", "decided: join"]);
}

#[test]
fn own_dns_unpublished_does_not_hold_back_a_set_aside() {
    let f = unpublished_self(Facts {
        data: wal_of(0xa1, OTHER_CLUSTER),
        cluster: healthy_without_us(),
        ..facts()
    });
    assert_eq!(
        decide(&f).action,
        Action::SetAside {
            why: SetAsideWhy::ForeignCluster
        }
    );
}

#[test]
fn own_dns_unpublished_does_not_hold_back_a_bootstrap_prepare() {
    let d = decide(&unpublished_self(facts()));
    assert!(
        matches!(d.action, Action::Bootstrap(Bootstrap::Prepare { .. })),
        "{d:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Invariants, over generated facts. Small alphabets (three nonces, three member IDs, two
// cluster IDs) make the collisions that matter — our nonce in a peer's token, our member
// ID in the list — common.
// ---------------------------------------------------------------------------------------

mod invariants {
    use super::*;
    use etcd_steward::facts::hashes::{
        judge, Answered, Divergence, HashAnswer, HashCheck, HashGroup, HashRound, Verdict,
    };
    use etcd_steward::facts::rebuild::RebuildRequest;
    use proptest::prelude::*;
    use std::cmp::Reverse;

    const NONCES: [&str; 3] = ["n0", "n1", "n2"];

    fn nonce() -> impl Strategy<Value = String> {
        prop::sample::select(NONCES.to_vec()).prop_map(String::from)
    }

    fn token() -> impl Strategy<Value = String> {
        prop::collection::vec(nonce(), 1..=4).prop_map(|v| v.join("."))
    }

    fn formation() -> impl Strategy<Value = Formation> {
        (
            nonce(),
            prop::sample::select(vec![2u32, 3, 4]),
            prop::option::of(token()),
            prop::option::of(prop::sample::select(vec!["s1", "s2"])),
        )
            .prop_map(|(nonce, size, token, snapshot)| Formation {
                nonce,
                initial_cluster: initial_cluster(size),
                token,
                snapshot: snapshot.map(str::to_string),
            })
    }

    /// Snapshot names: the store lists `s1` and `s2`; `s3` is never in it (a `--restore`
    /// or a restore request may still name it).
    const SNAPSHOTS: [&str; 3] = ["s1", "s2", "s3"];

    fn backups() -> impl Strategy<Value = BackupFacts> {
        let snapshot = (
            prop::sample::select(vec!["s1", "s2"]),
            prop::bool::weighted(0.75),
            prop::bool::weighted(0.2),
        )
            .prop_map(|(name, verified, drill_failed)| SnapshotFacts {
                name: name.into(),
                revision: 7,
                time_unix: 1,
                verified,
                drill_failed,
                content: SnapshotContent::default(),
                key: None,
                archive: None,
            });
        let wanted = prop_oneof![
            2 => Just(RestoreWanted::Latest),
            1 => prop::sample::select(SNAPSHOTS.to_vec()).prop_map(|n| RestoreWanted::Named(n.into())),
        ];
        prop_oneof![
            2 => Just(BackupFacts::Off),
            1 => Just(BackupFacts::NotAsked),
            1 => Just(BackupFacts::Unreachable { error: "connection refused".into() }),
            3 => (wanted, prop::collection::vec(snapshot, 0..3)).prop_map(|(wanted, snapshots)| {
                BackupFacts::Listed {
                    wanted,
                    snapshots,
                    keys: vec![],
                }
            }),
        ]
    }

    /// What this pod remembers failing: the same bytes as the store lists (they hold), or
    /// an entry of an older version (it holds nothing).
    fn rejections() -> impl Strategy<Value = Vec<Rejection>> {
        let rejection =
            (prop::sample::select(vec!["s1", "s2"]), any::<bool>()).prop_map(|(name, checksum)| {
                Rejection {
                    name: name.into(),
                    failed: if checksum {
                        Failed::Checksum {
                            content: SnapshotContent::default(),
                            detail: "sha256 mismatch".into(),
                        }
                    } else {
                        Failed::Unrecorded {
                            detail: "sha256 mismatch".into(),
                        }
                    },
                }
            });
        prop_oneof![
            4 => Just(vec![]),
            1 => prop::collection::vec(rejection, 1..=2),
        ]
    }

    fn wal_identity() -> impl Strategy<Value = WalIdentity> {
        (
            prop::sample::select(vec![0xa0u64, 0xa1, 0xa2]),
            prop::sample::select(vec![CLUSTER, OTHER_CLUSTER]),
        )
            .prop_map(|(member_id, cluster_id)| WalIdentity {
                member_id,
                cluster_id,
            })
    }

    fn wal_state() -> impl Strategy<Value = WalState> {
        prop_oneof![
            Just(WalState::None),
            wal_identity().prop_map(|w| WalState::Present(Ok(w))),
            Just(WalState::Present(Err("unreadable".into()))),
        ]
    }

    /// A log's tail: few values, so that volumes tie as often as they differ.
    fn wal_tail() -> impl Strategy<Value = WalTail> {
        (
            prop::sample::select(vec![3u64, 4]),
            prop::sample::select(vec![100u64, 500, 900]),
            0u64..3,
            any::<bool>(),
        )
            .prop_map(|(last_term, last_index, behind, clean_end)| WalTail {
                last_index,
                last_term,
                commit: last_index - behind,
                term: last_term,
                clean_end,
            })
    }

    /// A recovery marker: its commit index is behind, at or past the generated tails'.
    fn recovery_marker() -> impl Strategy<Value = RecoveryMarker> {
        (
            prop::sample::select(vec!["r0", "r1"]),
            prop::sample::select(vec![99u64, 499, 500, 900]),
        )
            .prop_map(|(id, commit)| RecoveryMarker {
                id: id.into(),
                commit,
            })
    }

    /// A leave marker: its member is listed by the generated clusters or not.
    fn left_marker() -> impl Strategy<Value = LeftMarker> {
        prop::sample::select(vec![0xa0u64, 0xa1, 0xa2, 0xb1])
            .prop_map(|member_id| LeftMarker { ts: 1, member_id })
    }

    fn unreadable_markers() -> impl Strategy<Value = Vec<String>> {
        prop::sample::select(vec![
            "leave marker /data/steward-left.json: EOF while parsing",
            "restore marker /data/member/steward/restored-for.json: Permission denied",
        ])
        .prop_map(|m| vec![m.to_string()])
    }

    fn data_dir() -> BoxedStrategy<DataDirState> {
        (
            wal_state(),
            prop::option::of(formation()),
            prop::option::weighted(0.8, wal_tail()),
            prop::option::weighted(0.25, recovery_marker()),
            prop::option::weighted(0.2, prop::sample::select(vec!["restore-0", "restore-1"])),
            prop::option::weighted(0.12, left_marker()),
            prop::option::weighted(0.08, unreadable_markers()),
            rejections(),
        )
            .prop_map(
                |(wal, formation, tail, recovery, restored_for, left, unreadable, rejected)| {
                    // `observe` reads the tail only from a WAL.
                    let tail = tail.filter(|_| wal != WalState::None);
                    DataDirState {
                        wal,
                        tail,
                        recovery,
                        restored_for: restored_for.map(str::to_string),
                        left,
                        formation,
                        notes: vec![],
                        rejected_snapshots: rejected,
                        unreadable_markers: unreadable.unwrap_or_default(),
                    }
                },
            )
            .boxed()
    }

    fn lookup(o: u32) -> impl Strategy<Value = Lookup> {
        prop_oneof![
            4 => Just(found(o)),
            1 => Just(Lookup::NotFound),
            1 => Just(Lookup::Failed("SERVFAIL".into())),
        ]
    }

    fn report(o: u32) -> impl Strategy<Value = PeerReport> {
        (
            prop::bool::weighted(0.4),
            prop::option::of(wal_identity()),
            prop::option::of(formation()),
            prop::option::weighted(0.85, wal_tail()),
        )
            .prop_map(move |(has_data, wal, formation, log)| PeerReport {
                name: pod(o),
                has_data,
                // As `parse_report` enforces: no WAL identity without data.
                wal: wal.filter(|_| has_data),
                wal_error: None,
                formation,
                log: log.filter(|_| has_data),
                ..Default::default()
            })
    }

    /// A peer as `observe` reports it: its sidecar is asked only when its name resolved.
    fn peer(o: u32) -> impl Strategy<Value = PeerFacts> {
        (
            lookup(o),
            prop_oneof![
                5 => report(o).prop_map(Ok),
                1 => Just(Err("connection refused".to_string())),
            ],
        )
            .prop_map(move |(dns, report)| PeerFacts {
                ordinal: o,
                name: pod(o),
                report: matches!(dns, Lookup::Found(_)).then_some(report),
                dns,
            })
    }

    /// At most one member per pod of four, with distinct IDs (as etcd guarantees).
    fn members() -> impl Strategy<Value = Vec<MemberInfo>> {
        (0u32..4)
            .map(|o| {
                prop::option::of((
                    prop::sample::select(vec![0xa0 + u64::from(o), 0xb0 + u64::from(o)]),
                    any::<bool>(),
                    any::<bool>(),
                ))
                .prop_map(move |m| {
                    m.map(|(id, started, is_learner)| {
                        let name = if started { pod(o) } else { String::new() };
                        member(id, o, &name, is_learner)
                    })
                })
            })
            .collect::<Vec<_>>()
            .prop_map(|ms| ms.into_iter().flatten().collect())
    }

    fn cluster() -> impl Strategy<Value = ClusterFacts> {
        prop_oneof![
            members().prop_map(healthy),
            Just(not_reached()),
            Just(ClusterFacts::NotReached { tried: vec![] }),
        ]
    }

    fn release() -> impl Strategy<Value = EtcdVersion> {
        prop::sample::select(vec![(3, 4, 23), (3, 5, 19), (3, 5, 30), (3, 6, 1)]).prop_map(
            |(major, minor, patch)| EtcdVersion {
                major,
                minor,
                patch,
            },
        )
    }

    /// The store's newest verified snapshot as `init` sees it before a newer minor release.
    fn snapshot_age() -> impl Strategy<Value = Result<Option<u64>, String>> {
        prop_oneof![
            Just(Ok(None)),
            (0u64..120).prop_map(|a| Ok(Some(a))),
            Just(Err("the store does not answer".to_string())),
        ]
    }

    /// Mostly nothing known (which holds nothing); sometimes releases that may hold a start,
    /// or a rolling upgrade's first pod on a newer minor release (with backups: a snapshot
    /// first).
    fn versions() -> impl Strategy<Value = VersionFacts> {
        let peer =
            (0u32..4, release(), prop::option::of(release())).prop_map(|(o, server, cluster)| {
                PeerVersion {
                    name: pod(o),
                    server,
                    cluster,
                }
            });
        prop_oneof![
            4 => Just(VersionFacts::default()),
            1 => (
                prop::option::of(release()),
                prop::collection::vec(peer, 0..3),
                prop::option::of(any::<bool>()),
                prop::option::of(snapshot_age()),
            )
                .prop_map(|(binary, peers, auth_on_3_4, snapshot_age)| VersionFacts {
                    binary,
                    peers,
                    auth_on_3_4,
                    snapshot_age,
                }),
            1 => snapshot_age().prop_map(|age| VersionFacts {
                binary: Some(EtcdVersion { major: 3, minor: 5, patch: 30 }),
                peers: vec![PeerVersion {
                    name: pod(1),
                    server: EtcdVersion { major: 3, minor: 4, patch: 23 },
                    cluster: Some(EtcdVersion { major: 3, minor: 4, patch: 0 }),
                }],
                auth_on_3_4: Some(false),
                snapshot_age: Some(age),
            }),
        ]
    }

    /// A recovery request, before it is tied to a set: whether it names this pod (else
    /// `other`), which peers it names lost for good (a bit per peer), and its ID.
    type RawRecovery = (bool, u32, u8, &'static str);

    fn raw_recovery() -> impl Strategy<Value = Option<RawRecovery>> {
        prop::option::weighted(
            0.35,
            (
                prop::bool::weighted(0.75),
                0u32..5,
                prop_oneof![2 => Just(0u8), 1 => any::<u8>()],
                prop::sample::select(vec!["r0", "r1"]),
            ),
        )
    }

    fn restore_requests() -> impl Strategy<Value = RestoreRequest> {
        (
            prop::sample::select(vec!["restore-0", "restore-1"]),
            prop::sample::select(SNAPSHOTS.to_vec()),
        )
            .prop_map(|(id, snapshot)| RestoreRequest {
                id: id.into(),
                snapshot: snapshot.into(),
                expires_unix: u64::MAX,
            })
    }

    /// A rebuild request before it is tied to a set's facts: whom it names (0–5: this
    /// volume's member; 6: another voter it counted; 7: a member the cluster never listed),
    /// which voters its check counted (0–4: the voters listed now; 5: those and a voter
    /// since removed; 6: those but one, which joined since: a stale proof), each counted
    /// voter's answer (0–3: the majority's hash 7; 4: hash 9; 5: hash 8; 6: silent; 7: hash
    /// 7 from another compacted revision; the named member's own answer is drawn from
    /// those with 9 likelier), whether its verdict is forged (it claims the named member
    /// diverged against hash 7, whatever its answers give), and whether a non-voter's and a
    /// second answer of the named member (the majority's hash) ride along.
    #[derive(Debug, Clone)]
    struct RawRebuild {
        whom: u8,
        counted: u8,
        answers: Vec<u8>,
        own: u8,
        forged: bool,
        extra: bool,
    }

    fn raw_rebuild() -> impl Strategy<Value = RawRebuild> {
        (
            0u8..8,
            0u8..7,
            prop::collection::vec(0u8..8, 6),
            prop_oneof![4 => Just(4u8), 1 => 0u8..8],
            prop::bool::weighted(0.15),
            prop::bool::weighted(0.2),
        )
            .prop_map(|(whom, counted, answers, own, forged, extra)| RawRebuild {
                whom,
                counted,
                answers,
                own,
                forged,
                extra,
            })
    }

    /// The voters `cluster` lists now (none when no cluster answered).
    fn voters_now(cluster: &ClusterFacts) -> Vec<u64> {
        match cluster {
            ClusterFacts::Healthy(v) => v
                .members
                .iter()
                .filter(|m| !m.is_learner)
                .map(|m| m.id)
                .collect(),
            _ => vec![],
        }
    }

    /// `raw` tied to `f`: a request about this volume's member (or another), proven or not
    /// by a check of the voters `f`'s cluster lists (or others), held by this pod's sidecar.
    fn tie_rebuild(f: &Facts, raw: &RawRebuild) -> RebuildRequest {
        let own = f
            .data
            .wal_identity()
            .map_or(0xa0 + u64::from(f.ordinal), |w| w.member_id);
        let now = voters_now(&f.cluster);
        let mut counted = match raw.counted {
            5 => now.iter().copied().chain([0xc9]).collect(),
            6 => {
                let mut c = now.clone();
                if let Some(i) = c.iter().position(|v| *v != own) {
                    c.remove(i);
                }
                c
            }
            _ => now.clone(),
        };
        if counted.is_empty() {
            counted = vec![0xa0, 0xa1, 0xa2];
        }
        let member = match raw.whom {
            6 => counted.iter().copied().find(|v| *v != own).unwrap_or(own),
            7 => 0xdd,
            _ => own,
        };
        let answer = |m: u64, choice: u8| HashAnswer {
            member: m,
            got: match choice {
                0..=3 => Answered::Hash {
                    hash: 7,
                    compact_revision: 2,
                },
                4 => Answered::Hash {
                    hash: 9,
                    compact_revision: 2,
                },
                5 => Answered::Hash {
                    hash: 8,
                    compact_revision: 2,
                },
                6 => Answered::NoAnswer {
                    error: "deadline exceeded".into(),
                },
                _ => Answered::Hash {
                    hash: 7,
                    compact_revision: 3,
                },
            },
        };
        let mut answers: Vec<HashAnswer> = counted
            .iter()
            .zip(raw.answers.iter().cycle())
            .map(|(v, c)| answer(*v, if *v == member { raw.own } else { *c }))
            .collect();
        if raw.extra {
            answers.push(answer(0xb7, 0));
            answers.push(answer(member, 0));
        }
        let verdict = if raw.forged {
            let mut voters = counted.clone();
            voters.sort_unstable();
            Verdict::Diverged(Divergence {
                revision: 40,
                compact_revision: 2,
                majority_hash: 7,
                agreeing: voters.iter().copied().filter(|v| *v != member).collect(),
                voters,
                diverged: vec![HashGroup {
                    hash: 9,
                    members: vec![member],
                }],
                silent: vec![],
            })
        } else {
            judge(&HashRound {
                revision: 40,
                voters: counted,
                answers: answers.clone(),
            })
        };
        RebuildRequest::new(
            member,
            HashCheck {
                at: 1_800_000_000,
                checker: 0xa0,
                verdict,
                answers,
            },
            u64::MAX,
        )
    }

    /// A pod whose volume holds the data of a member the cluster lists at this pod's URL
    /// (mostly; sometimes no cluster answers), its sidecar holding a rebuild request for
    /// it: proven by a majority of the voters listed now, or not.
    fn a_rebuild_under_way() -> impl Strategy<Value = Facts> {
        (
            anything(),
            raw_rebuild(),
            prop::bool::weighted(0.85),
            prop::bool::weighted(0.9),
        )
            .prop_map(|(mut f, raw, answers, voter)| {
                let own = 0xa0 + u64::from(f.ordinal);
                f.data.wal = WalState::Present(Ok(WalIdentity {
                    member_id: own,
                    cluster_id: CLUSTER,
                }));
                f.data.left = None;
                f.data.unreadable_markers = vec![];
                f.own_dns = found(f.ordinal);
                let mut members = match &f.cluster {
                    ClusterFacts::Healthy(v) => v.members.clone(),
                    _ => vec![],
                };
                members.retain(|m| m.id != own && !m.peer_urls.contains(&f.peer_url));
                members.push(member(own, f.ordinal, &f.name, !voter));
                f.cluster = if answers {
                    healthy(members)
                } else {
                    not_reached()
                };
                f.rebuild_request = Some(tie_rebuild(&f, &raw));
                f
            })
    }

    /// Written from the rule rather than by calling `proves`: the request held names this
    /// volume's member, and among the voters the cluster lists now (their first answer
    /// each, in the request's answers) a strict majority answered one hash, every voter
    /// that answered did so from one compacted revision, and this member answered another
    /// hash.
    fn a_majority_proves_this_member_diverged(f: &Facts) -> bool {
        let (Some(r), Some(wal)) = (&f.rebuild_request, f.data.wal_identity()) else {
            return false;
        };
        let voters = voters_now(&f.cluster);
        if r.member != wal.member_id || voters.is_empty() {
            return false;
        }
        let mut first: Vec<(u64, u32, i64)> = Vec::new();
        for a in &r.check.answers {
            if !voters.contains(&a.member) || first.iter().any(|(m, _, _)| *m == a.member) {
                continue;
            }
            if let Answered::Hash {
                hash,
                compact_revision,
            } = a.got
            {
                first.push((a.member, hash, compact_revision));
            }
        }
        if first.windows(2).any(|w| w[0].2 != w[1].2) {
            return false;
        }
        let Some(own) = first.iter().find(|(m, _, _)| *m == r.member).map(|a| a.1) else {
            return false;
        };
        first.iter().any(|(_, majority, _)| {
            *majority != own
                && 2 * first.iter().filter(|(_, h, _)| h == majority).count() > voters.len()
        })
    }

    /// The healthy cluster that answered lists this volume's member (by ID, in the WAL's
    /// cluster).
    fn lists_this_volumes_member(f: &Facts) -> bool {
        let (ClusterFacts::Healthy(v), Some(wal)) = (&f.cluster, f.data.wal_identity()) else {
            return false;
        };
        v.cluster_id == wal.cluster_id && v.members.iter().any(|m| m.id == wal.member_id)
    }

    /// Any facts: mostly anything at all, and some formations, recoveries and rebuilds
    /// under way (which random facts rarely get as far as a start, a forced start or a
    /// member's data set aside as diverged).
    fn any_facts() -> impl Strategy<Value = Facts> {
        prop_oneof![
            4 => anything().boxed(),
            1 => a_formation_under_way().boxed(),
            1 => a_recovery_under_way().boxed(),
            1 => a_rebuild_under_way().boxed(),
        ]
    }

    /// A pod with data and a readable log tail, no cluster answering, a recovery request
    /// naming it (its own lost pods, its own ID), and every peer answering as generated,
    /// most of those with data in this pod's cluster: whose log is fresher decides.
    fn a_recovery_under_way() -> impl Strategy<Value = Facts> {
        (
            anything(),
            wal_identity(),
            wal_tail(),
            raw_recovery().prop_filter_map("a request", |r| r),
            prop::collection::vec(prop::bool::weighted(0.85), 5),
        )
            .prop_map(|(mut f, wal, tail, (_, _, lost, id), same_cluster)| {
                f.data.wal = WalState::Present(Ok(wal));
                f.data.tail = Some(tail);
                f.data.left = None;
                f.data.unreadable_markers = vec![];
                f.own_dns = found(f.ordinal);
                f.cluster = not_reached();
                f.recovery_request = Some(RecoveryRequest {
                    id: id.into(),
                    survivor: f.name.clone(),
                    force_lost: f
                        .peers
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| lost >> (i % 8) & 1 == 1)
                        .map(|(_, p)| p.name.clone())
                        .collect(),
                    expires_unix: u64::MAX,
                });
                for (p, same) in f.peers.iter_mut().zip(same_cluster) {
                    let mut report = match p.report.take() {
                        Some(Ok(r)) => r,
                        _ => empty_report(p.ordinal),
                    };
                    if same {
                        if let Some(w) = report.wal.as_mut() {
                            w.cluster_id = wal.cluster_id;
                        }
                    }
                    p.dns = found(p.ordinal);
                    p.report = Some(Ok(report));
                }
                f
            })
    }

    /// An initial pod with an empty volume, its name published and no cluster answering.
    /// Every peer answers: with an empty volume prepared like this pod (its own nonce, the
    /// same snapshot), not prepared, with a marker as generated, or prepared for another
    /// initial cluster; or with the data of this pod's formation, started (its token holds
    /// this pod's nonce at this pod's ordinal).
    fn a_formation_under_way() -> impl Strategy<Value = Facts> {
        (
            anything().prop_filter("an initial pod", |f| f.ordinal < f.replicas),
            prop::collection::vec(prop_oneof![6 => 0u8..3, 1 => 3u8..5], 5),
        )
            .prop_map(|(mut f, how)| {
                f.data.wal = WalState::None;
                f.data.tail = None;
                f.data.left = None;
                f.data.unreadable_markers = vec![];
                f.own_dns = found(f.ordinal);
                f.cluster = ClusterFacts::NotReached { tried: vec![] };
                let own = f.data.formation.clone();
                for (p, how) in f.peers.iter_mut().zip(how) {
                    let prepared = own.clone().map(|m| Formation {
                        nonce: NONCES[p.ordinal as usize % NONCES.len()].into(),
                        token: None,
                        ..m
                    });
                    let report = match p.report.take() {
                        Some(Ok(r)) => r,
                        _ => empty_report(p.ordinal),
                    };
                    let started = own.clone().map(|m| Formation {
                        nonce: NONCES[p.ordinal as usize % NONCES.len()].into(),
                        token: Some(formation_token(
                            &(0..f.replicas)
                                .map(|o| {
                                    if o == f.ordinal {
                                        m.nonce.as_str()
                                    } else {
                                        NONCES[o as usize % NONCES.len()]
                                    }
                                })
                                .collect::<Vec<_>>(),
                        )),
                        ..m.clone()
                    });
                    p.dns = found(p.ordinal);
                    p.report = Some(Ok(PeerReport {
                        has_data: how == 4 && started.is_some(),
                        wal: None,
                        log: None,
                        formation: match how {
                            0 => prepared.or(report.formation),
                            1 => None,
                            3 => prepared.map(|m| Formation {
                                initial_cluster: initial_cluster(f.replicas + 1),
                                ..m
                            }),
                            4 => started,
                            _ => report.formation,
                        },
                        ..report
                    }));
                }
                f
            })
    }

    prop_compose! {
        fn anything()(replicas in 1u32..=4, ordinal in 0u32..5)
            (peers in (0..replicas.max(ordinal + 2))
                .filter(|o| *o != ordinal)
                .map(peer)
                .collect::<Vec<_>>(),
             data in data_dir(),
             own_dns in prop_oneof![8 => Just(found(ordinal)), 1 => lookup(ordinal)],
             cluster in cluster(),
             backups in backups(),
             fresh in nonce(),
             recovery in raw_recovery(),
             rebuild in prop::option::weighted(0.15, raw_rebuild()),
             restore in prop::option::weighted(0.3, restore_requests()),
             versions in versions(),
             aligned in prop::bool::weighted(0.7),
             replicas in Just(replicas),
             ordinal in Just(ordinal))
            -> Facts
        {
            let (mut data, mut peers) = (data, peers);
            if aligned {
                // Most formation markers are for this set's initial cluster, so that
                // formations get as far as their start.
                let ours = initial_cluster(replicas);
                let markers = data.formation.iter_mut().chain(peers.iter_mut().filter_map(|p| {
                    p.report.as_mut()?.as_mut().ok()?.formation.as_mut()
                }));
                for m in markers {
                    m.initial_cluster = ours.clone();
                }
            }
            let recovery_request = recovery.map(|(names_me, other, lost, id)| RecoveryRequest {
                id: id.into(),
                survivor: pod(if names_me { ordinal } else { other }),
                force_lost: peers
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| lost >> (i % 8) & 1 == 1)
                    .map(|(_, p)| p.name.clone())
                    .collect(),
                expires_unix: u64::MAX,
            });
            let mut f = Facts {
                ordinal,
                name: pod(ordinal),
                set_name: "etcd".into(),
                host: host(ordinal),
                peer_url: peer_url(ordinal),
                replicas,
                initial_cluster: initial_cluster(replicas),
                data,
                own_dns,
                cluster,
                peers,
                backups,
                fresh_nonce: fresh,
                recovery_request,
                restore_request: restore,
                rebuild_request: None,
                versions,
            };
            f.rebuild_request = rebuild.map(|r| tie_rebuild(&f, &r));
            f
        }
    }

    fn is_bootstrap(a: &Action) -> bool {
        matches!(a, Action::Bootstrap { .. })
    }

    fn peer_reports(f: &Facts) -> impl Iterator<Item = &PeerReport> {
        f.peers
            .iter()
            .filter_map(|p| p.report.as_ref().and_then(|r| r.as_ref().ok()))
    }

    /// `f` with peer `i` (of its peers) answering that its volume holds data, as `r` says.
    fn with_a_peer_holding_data(mut f: Facts, i: prop::sample::Index, r: PeerReport) -> Facts {
        let n = f.peers.len();
        let p = &mut f.peers[i.index(n)];
        p.dns = found(p.ordinal);
        p.report = Some(Ok(PeerReport {
            name: p.name.clone(),
            has_data: true,
            ..r
        }));
        f
    }

    /// Facts where this pod has no formation marker and some peer reports data.
    fn a_peer_has_data_and_we_have_no_marker() -> impl Strategy<Value = Facts> {
        (any_facts(), any::<prop::sample::Index>(), report(0)).prop_map(|(mut f, i, r)| {
            f.data.formation = None;
            with_a_peer_holding_data(f, i, r)
        })
    }

    /// Facts where some peer reports data; everything else as generated.
    fn a_peer_holds_data() -> impl Strategy<Value = Facts> {
        (any_facts(), any::<prop::sample::Index>(), report(0))
            .prop_map(|(f, i, r)| with_a_peer_holding_data(f, i, r))
    }

    /// How an initial peer can fail to answer for its volume.
    fn unaccounted(p: &mut PeerFacts, how: u8) {
        match how % 3 {
            0 => {
                p.dns = Lookup::NotFound;
                p.report = None;
            }
            1 => {
                p.dns = Lookup::Failed("SERVFAIL".into());
                p.report = None;
            }
            _ => {
                p.dns = found(p.ordinal);
                p.report = Some(Err("connection refused".into()));
            }
        }
    }

    /// Facts where an initial peer did not answer and this pod has not settled on a token.
    fn an_initial_peer_is_unaccounted_for() -> impl Strategy<Value = Facts> {
        (any_facts(), any::<prop::sample::Index>(), any::<u8>()).prop_map(|(mut f, i, how)| {
            if let Some(m) = f.data.formation.as_mut() {
                m.token = None;
            }
            let replicas = f.replicas;
            let mut initial: Vec<&mut PeerFacts> = f
                .peers
                .iter_mut()
                .filter(|p| p.ordinal < replicas)
                .collect();
            if !initial.is_empty() {
                let n = initial.len();
                unaccounted(initial[i.index(n)], how);
            }
            f
        })
    }

    fn peer_holds_a_token_with_our_nonce(f: &Facts) -> bool {
        let Some(own) = f.data.formation.as_ref() else {
            return false;
        };
        peer_reports(f).any(|r| {
            r.formation
                .as_ref()
                .and_then(|pf| pf.token.as_deref())
                .is_some_and(|t| t.split('.').nth(f.ordinal as usize) == Some(own.nonce.as_str()))
        })
    }

    /// A formation start that forms nothing new: this pod takes part in a formation it
    /// already agreed to, with `token` either the one its own marker recorded, or the one a
    /// peer that started it (it holds data) recorded with this pod's nonce at this pod's
    /// ordinal, for the same initial cluster. The cluster that results is the one those
    /// peers' data belongs to (etcd derives the cluster ID from the initial cluster and the
    /// token).
    fn starts_a_formation_it_agreed_to(f: &Facts, token: &str) -> bool {
        let Some(own) = f.data.formation.as_ref() else {
            return false;
        };
        own.token.as_deref() == Some(token)
            || peer_reports(f).any(|r| {
                r.has_data
                    && r.formation.as_ref().is_some_and(|pf| {
                        pf.token.as_deref() == Some(token)
                            && pf.initial_cluster == own.initial_cluster
                            && token.split('.').nth(f.ordinal as usize) == Some(own.nonce.as_str())
                    })
            })
    }

    /// Whether this pod may restore snapshot `s`: the store vouched for it when it was
    /// taken, its drill did not fail, and this pod does not remember these very bytes
    /// failing (a rejection an older version recorded by name only holds nothing).
    fn usable(f: &Facts, s: &SnapshotFacts) -> bool {
        s.verified && !s.drill_failed && !f.data.rejected_snapshots.iter().any(|r| {
            r.name == s.name
                && matches!(&r.failed, Failed::Checksum { content, .. } if *content == s.content)
        })
    }

    /// The snapshot this pod's `--restore` leads to, when its own look at the store shows
    /// one usable: the named one, or the newest usable for `latest`.
    fn usable_here(f: &Facts) -> Option<&SnapshotFacts> {
        let BackupFacts::Listed {
            wanted, snapshots, ..
        } = &f.backups
        else {
            return None;
        };
        match wanted {
            RestoreWanted::Named(n) => snapshots.iter().find(|s| &s.name == n),
            RestoreWanted::Latest => snapshots.iter().find(|s| usable(f, s)),
            RestoreWanted::Revision(n) => snapshots.iter().find(|s| {
                let reach = s.archive.as_ref().map_or(s.revision, |a| a.last_revision);
                usable(f, s) && s.revision <= *n && reach >= *n
            }),
            RestoreWanted::Time(t) => snapshots.iter().find(|s| {
                let taken = s.time_unix * 1000;
                let reach = match &s.archive {
                    Some(a) if a.last_revision > s.revision => a.last_time_unix_ms.max(taken),
                    _ => taken,
                };
                usable(f, s) && taken <= *t && reach >= *t
            }),
        }
        .filter(|s| usable(f, s))
    }

    /// Whether the backup store said what a new cluster starts from: backups are off, the
    /// store holds nothing (for `latest`), or the snapshot `--restore` leads to is usable.
    /// Not when the store was not asked or did not answer, nor when it holds snapshots
    /// but none this pod may restore.
    fn store_says_what_a_new_cluster_starts_from(f: &Facts) -> bool {
        match &f.backups {
            BackupFacts::Off => true,
            BackupFacts::NotAsked | BackupFacts::Unreachable { .. } => false,
            BackupFacts::Listed {
                wanted: RestoreWanted::Latest,
                snapshots,
                ..
            } if snapshots.is_empty() => true,
            BackupFacts::Listed { .. } => usable_here(f).is_some(),
        }
    }

    /// A recovery request `decide` may act on, written from `recovery`'s rules rather
    /// than by calling it, so that a `decide` that skips or bends the plan is caught: it
    /// names this pod as the survivor, no live cluster answered, this volume holds data
    /// whose log tail is readable and no recovery marker for this very request (that one
    /// was acted on already), and this pod's own look at its peers leads to the same
    /// survivor: every peer that could hold data answered (or the request names it lost
    /// for good; an ordinal beyond the initial size whose name does not exist is no pod),
    /// and every other volume with data belongs to the same cluster, says how far its log
    /// goes, and is not fresher (raft's up-to-date rule: last term, last index, commit; a
    /// tie goes to the lowest ordinal).
    fn a_valid_recovery_request_names_this_pod(f: &Facts) -> bool {
        let Some(r) = &f.recovery_request else {
            return false;
        };
        let Some(own) = f.data.tail else {
            return false;
        };
        if r.survivor != f.name
            || !f.data.has_data()
            || !matches!(f.cluster, ClusterFacts::NotReached { .. })
            || f.data.recovery.as_ref().is_some_and(|m| m.id == r.id)
        {
            return false;
        }
        let own_cluster = f.data.wal_identity().map(|w| w.cluster_id);
        let ours = (own.freshness(), Reverse(f.ordinal));
        f.peers
            .iter()
            .filter(|p| !r.force_lost.contains(&p.name))
            .all(|p| match (&p.dns, &p.report) {
                (Lookup::NotFound, _) if p.ordinal >= f.replicas => true,
                (_, Some(Ok(report))) if !report.has_data => true,
                (_, Some(Ok(report))) => {
                    report.wal.map(|w| w.cluster_id) == own_cluster
                        && report
                            .log
                            .is_some_and(|l| (l.freshness(), Reverse(p.ordinal)) < ours)
                }
                _ => false,
            })
    }

    /// This volume's recovery marker `id` records a forced start that did not happen yet
    /// (its commit index has not moved past the recorded one): an earlier request, acted
    /// on, whose start was interrupted.
    fn forced_start_pending(f: &Facts, id: &str) -> bool {
        match (&f.data.recovery, f.data.tail) {
            (Some(m), Some(t)) => m.id == id && t.commit <= m.commit,
            _ => false,
        }
    }

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 1024,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// What the generator leads `decide` to, over a fixed sample: the action (a formation
    /// by its step, a set-aside by its cause) and the reason's variant.
    fn sampled_decisions() -> &'static [(&'static str, String)] {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        use std::sync::OnceLock;

        static SAMPLE: OnceLock<Vec<(&'static str, String)>> = OnceLock::new();
        SAMPLE.get_or_init(|| {
            let mut runner = TestRunner::deterministic();
            let strategy = any_facts();
            (0..12_000)
                .filter_map(|_| strategy.new_tree(&mut runner).ok())
                .map(|tree| {
                    let d = decide(&tree.current());
                    let action = match d.action {
                        Action::Bootstrap(Bootstrap::Prepare { .. }) => "bootstrap-prepare",
                        Action::Bootstrap(Bootstrap::Start { .. }) => "bootstrap-start",
                        Action::SetAside { why } => why.slug(),
                        other => other.name(),
                    };
                    (action, d.why.name())
                })
                .collect()
        })
    }

    /// The generator is only worth something if it reaches every kind of decision,
    /// including the dangerous ones the invariants rule out elsewhere.
    #[test]
    fn generated_facts_reach_every_action() {
        use std::collections::BTreeSet;

        let seen: BTreeSet<&str> = sampled_decisions().iter().map(|(a, _)| *a).collect();
        let expected: BTreeSet<&str> = [
            "restart",
            "bootstrap-prepare",
            "bootstrap-start",
            "join",
            "resume",
            "replace",
            "foreign-cluster",
            "removed-member",
            "not-a-member",
            "restore-requested",
            "left",
            "diverged",
            "update-peer-urls",
            "recover",
            "snapshot",
            "wait",
        ]
        .into_iter()
        .collect();
        assert_eq!(seen, expected);
    }

    /// Every branch of `decide` ends in its own reason: the generator reaches each one, so
    /// a change to any branch (the recovery's, the restore's, the leave's) is seen by the
    /// properties.
    #[test]
    fn generated_facts_reach_every_reason() {
        use std::collections::BTreeSet;

        let seen: BTreeSet<&str> = sampled_decisions()
            .iter()
            .map(|(_, w)| w.as_str())
            .collect();
        let expected: BTreeSet<&str> = [
            "DataAndNoClusterAnswered",
            "OutnumberedByAnotherCluster",
            "ForeignCluster",
            "OwnMemberListed",
            "MemberRemoved",
            "MemberDiverged",
            "RebuildWaitsForCluster",
            "UnreadableWalButListed",
            "UnreadableWalNotListed",
            "NoMemberForThisPod",
            "NeverStartedLearner",
            "NeverStartedFormationMember",
            "StaleEntry",
            "BeyondInitialSize",
            "AgreedEarlier",
            "PeerStartedOurFormation",
            "PeersHoldData",
            "NoProofYet",
            "ReadyToPrepare",
            "BackupStoreUnreachable",
            "NoUsableBackup",
            "NamedBackupUnusable",
            "OtherSnapshot",
            "OtherInitialCluster",
            "WaitingForPrepare",
            "FormNew",
            "RecoveryRequested",
            "RecoveryNotApplied",
            "RecoveryChoseOther",
            "RecoveryRefused",
            "RestoreRequested",
            "RestoreWhileAClusterAnswers",
            "LeftAndRemoved",
            "RestoreNotSeen",
            "PeerUrlChanged",
            "LeaveNotDone",
            "Left",
            "MarkerUnreadable",
            "OwnNameNotPublished",
            "OwnNameFails",
            "VersionHeld",
            "SnapshotBeforeUpgrade",
        ]
        .into_iter()
        .collect();
        assert_eq!(seen, expected);
    }

    /// A case of the ignored property below, and why it matters: pod etcd-1's volume holds
    /// no WAL but the formation marker of a formation it agreed to, while the cluster (its
    /// peers running on their data) lists it as a member that started: its data was lost.
    /// Without a request that stale entry is replaced and the pod joins with a new ID; with
    /// a restore request held, `decide` starts the formation again, i.e. with the old
    /// member ID and no data (the token agreed earlier is checked before anything else).
    #[test]
    fn during_a_restore_an_empty_volume_whose_member_started_never_starts_with_its_old_id() {
        let f = with_marker(facts(), marker_with_token("n1", "n0.n1.n2"));
        let f = Facts {
            cluster: healthy_with(started_voter(0xa1, 1)),
            ..with_peer(
                with_peer(f, started_peer(0, 0xa0, None)),
                started_peer(2, 0xa2, None),
            )
        };
        assert!(
            matches!(decide(&f).action, Action::Replace { .. }),
            "without a request: {:?}",
            decide(&f)
        );
        let f = Facts {
            restore_request: Some(super::restore_request()),
            ..f
        };
        let d = decide(&f);
        assert!(!is_bootstrap(&d.action), "{:?}: {}", d.action, d.reason());
        assert!(
            matches!(d.why, Why::RestoreWhileAClusterAnswers { .. }),
            "{:?}",
            d
        );
        // The new formation answering, listing this pod as a member it never started:
        // this pod prepared for it and starts as that member.
        let f = Facts {
            cluster: healthy_with(member(0xa1, 1, "", false)),
            ..f
        };
        assert!(is_bootstrap(&decide(&f).action), "{:?}", decide(&f));
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn never_bootstrap_when_a_peer_has_data_and_we_have_no_marker(
            f in a_peer_has_data_and_we_have_no_marker()
        ) {
            let d = decide(&f);
            prop_assert!(!is_bootstrap(&d.action), "{:?}: {}", d.action, d.reason());
        }

        /// A peer's volume holds data. A new cluster would stand beside (or over) that
        /// data, a forced start would drop its member: neither happens unless a request
        /// that `decide` may act on stands. Valid here means:
        /// - for `Recover`: a recovery request naming this pod whose plan this pod's own
        ///   observations agree with (`a_valid_recovery_request_names_this_pod`), or this
        ///   volume's marker of such a request acted on, whose forced start did not
        ///   happen yet (`forced_start_pending`);
        /// - for `Bootstrap`: no request at all. A restore request does not form a cluster
        ///   over a peer's data (every pod sets its data aside first, then the set forms
        ///   from empty volumes), so only a start that forms nothing new passes: this pod
        ///   taking part in the formation it already agreed to, which the peers' data
        ///   belongs to (`starts_a_formation_it_agreed_to`). Preparing one never does.
        #[test]
        fn no_bootstrap_or_recover_while_a_peer_holds_data_and_no_valid_request_stands(
            f in a_peer_holds_data()
        ) {
            let d = decide(&f);
            match &d.action {
                Action::Bootstrap(Bootstrap::Prepare { .. }) => {
                    prop_assert!(false, "prepared a new cluster beside a peer's data: {}", d.reason());
                }
                Action::Bootstrap(Bootstrap::Start { token, .. }) => prop_assert!(
                    starts_a_formation_it_agreed_to(&f, token),
                    "formed cluster {} beside a peer's data: {}", token, d.reason()
                ),
                Action::Recover { first: true, .. } => prop_assert!(
                    a_valid_recovery_request_names_this_pod(&f),
                    "forced a new cluster over a peer's data without a recovery request this pod's plan agrees with ({:?}): {}",
                    f.recovery_request, d.reason()
                ),
                Action::Recover { first: false, id, .. } => prop_assert!(
                    forced_start_pending(&f, id),
                    "forced a new cluster over a peer's data without a pending recovery marker ({:?}, tail {:?}): {}",
                    f.data.recovery, f.data.tail, d.reason()
                ),
                _ => {}
            }
        }

        /// `Recover` (etcd's `--force-new-cluster`) only on an operator's request naming
        /// this pod, or to finish that request's forced start, recorded in this volume's
        /// marker, that did not happen yet (no request needed then: the sidecar may have
        /// let the request go). Never while a cluster answers, never without a readable
        /// log tail, never twice for the same request.
        #[test]
        fn recover_only_on_a_request_naming_this_pod_or_to_finish_its_forced_start(
            f in any_facts()
        ) {
            let d = decide(&f);
            let Action::Recover { id, commit, first } = &d.action else {
                return Ok(());
            };
            prop_assert!(
                matches!(f.cluster, ClusterFacts::NotReached { .. }),
                "forced a new cluster while a live cluster answered: {:?}", d
            );
            let Some(tail) = f.data.tail else {
                return Err(TestCaseError::fail(format!("forced a start without a readable WAL tail: {d:?}")));
            };
            if *first {
                prop_assert!(
                    f.recovery_request.as_ref().is_some_and(|r| r.survivor == f.name && &r.id == id),
                    "forced a new cluster without a recovery request naming this pod ({:?}): {:?}",
                    f.recovery_request, d
                );
                prop_assert_eq!(*commit, tail.commit, "a first forced start begins from the WAL's commit index");
                prop_assert!(
                    f.data.recovery.as_ref().is_none_or(|m| &m.id != id),
                    "forced recovery {} again though this volume's marker records it: {:?}", id, f.data.recovery
                );
            } else {
                prop_assert!(
                    forced_start_pending(&f, id)
                        && f.data.recovery.as_ref().is_some_and(|m| m.commit == *commit),
                    "forced a start again that the marker does not hold pending ({:?}, tail {:?}): {:?}",
                    f.data.recovery, tail, d
                );
            }
        }

        /// A volume holding data whose pod left the cluster (`etcd-steward leave`) never
        /// starts etcd or joins: it is set aside once a cluster answers without its
        /// member, and waits otherwise. An empty one waits for `rejoin`.
        #[test]
        fn a_pod_that_left_only_waits_or_sets_its_data_aside_once_its_member_is_removed(
            f in (any_facts(), left_marker()).prop_map(|(mut f, l)| {
                f.data.left = Some(l);
                f
            })
        ) {
            let d = decide(&f);
            let Some(left) = &f.data.left else { unreachable!() };
            let removed = matches!(&f.cluster, ClusterFacts::Healthy(v) if !v.members.iter().any(|m| m.id == left.member_id));
            let expected = if f.data.has_data() && removed && f.data.unreadable_markers.is_empty() {
                Action::SetAside { why: SetAsideWhy::Left }
            } else {
                Action::Wait
            };
            prop_assert_eq!(&d.action, &expected, "{}", d.reason());
        }

        /// A leave or restore marker that cannot be read: whatever else holds, init waits.
        #[test]
        fn an_unreadable_marker_always_means_wait(
            f in (any_facts(), unreadable_markers()).prop_map(|(mut f, m)| {
                f.data.unreadable_markers = m;
                f
            })
        ) {
            let d = decide(&f);
            prop_assert_eq!(&d.action, &Action::Wait, "{}", d.reason());
            prop_assert!(matches!(d.why, Why::MarkerUnreadable { .. }), "{:?}", d.why);
        }

        /// A restore request whose snapshot this pod's own look at the store does not show
        /// usable (not listed, unverified, drill failed, rejected here, another snapshot
        /// chosen by `--restore`, the store silent or not configured) never sets data
        /// aside: the volume is decided exactly as without the request. A volume already
        /// set aside for the request is never set aside for it again.
        #[test]
        fn a_restore_request_this_pod_cannot_see_usable_never_sets_data_aside(
            f in (any_facts(), restore_requests()).prop_map(|(mut f, r)| {
                f.restore_request = Some(r);
                f
            })
        ) {
            let d = decide(&f);
            let Some(r) = &f.restore_request else { unreachable!() };
            let set_aside = Action::SetAside { why: SetAsideWhy::RestoreRequested };
            let seen = usable_here(&f).is_some_and(|s| s.name == r.snapshot);
            if !seen {
                prop_assert_ne!(&d.action, &set_aside, "{}", d.reason());
                if f.data.has_data() {
                    let without = decide(&Facts { restore_request: None, ..f.clone() });
                    prop_assert_eq!(&d.action, &without.action, "{}", d.reason());
                }
            }
            if f.data.restored_for.as_deref() == Some(r.id.as_str()) {
                prop_assert_ne!(&d.action, &set_aside, "set aside twice for {}: {}", r.id, d.reason());
            }
        }

        #[test]
        fn data_present_never_yields_a_membership_change_or_bootstrap(
            f in (any_facts(), wal_state().prop_filter("data", |w| *w != WalState::None))
                .prop_map(|(f, wal)| Facts { data: DataDirState { wal, ..f.data.clone() }, ..f })
        ) {
            let d = decide(&f);
            // Updating the peer URL of this volume's own member (listed by its ID) keeps
            // the member: no member is added or removed. A forced start (`Recover`) runs
            // this volume's own data; when it may happen is the recovery properties' rule.
            // A snapshot before a newer minor release only reads the cluster.
            let own_entry_updated = match (&d.action, f.data.wal_identity()) {
                (Action::UpdatePeerUrls { member, .. }, Some(w)) => *member == w.member_id,
                _ => false,
            };
            prop_assert!(
                matches!(
                    d.action,
                    Action::Restart
                        | Action::SetAside { .. }
                        | Action::Wait
                        | Action::Recover { .. }
                        | Action::Snapshot { .. }
                ) || own_entry_updated,
                "{:?}: {}", d.action, d.reason()
            );
        }

        /// Without an operator's request (those have their own properties), a volume whose
        /// peers hold more of another cluster's data never starts alone.
        #[test]
        fn a_volume_outnumbered_by_another_clusters_volumes_never_starts_without_a_cluster(
            f in (any_facts(), wal_identity())
                .prop_map(|(f, w)| Facts {
                    data: DataDirState { wal: WalState::Present(Ok(w)), recovery: None, ..f.data.clone() },
                    recovery_request: None,
                    restore_request: None,
                    ..f
                })
        ) {
            prop_assume!(matches!(f.cluster, ClusterFacts::NotReached { .. }));
            let Some(own) = f.data.wal_identity().map(|w| w.cluster_id) else { unreachable!() };
            let held = |c: u64| f.peers.iter().filter(|p| matches!(&p.report, Some(Ok(r)) if r.wal.is_some_and(|w| w.cluster_id == c))).count();
            let other = if own == CLUSTER { OTHER_CLUSTER } else { CLUSTER };
            let d = decide(&f);
            if held(other) > 1 + held(own) {
                prop_assert_eq!(&d.action, &Action::Wait, "{}", d.reason());
            } else {
                prop_assert!(matches!(d.action, Action::Restart | Action::Wait), "{:?}: {}", d.action, d.reason());
            }
        }

        /// A cluster answered: a new cluster would stand beside it. (While a restore
        /// request stands, see the next property.)
        #[test]
        fn never_bootstrap_when_a_healthy_cluster_answered(
            f in (any_facts(), members()).prop_map(|(f, ms)| Facts { cluster: healthy(ms), restore_request: None, ..f })
        ) {
            let d = decide(&f);
            prop_assert!(!is_bootstrap(&d.action), "{:?}: {}", d.action, d.reason());
        }

        /// The README's "a new cluster needs proof that none exists: … and no etcd
        /// answers" holds while a restore request stands, too: the request replaces the
        /// cluster once its pods set their data aside, not while it still answers.
        /// The one exception: the cluster that answers is the new formation this pod
        /// prepared for, listing this pod as a member it never started.
        #[test]
        fn never_bootstrap_when_a_healthy_cluster_answered_even_while_a_restore_request_stands(
            f in (any_facts(), members(), restore_requests())
                .prop_map(|(f, ms, r)| Facts { cluster: healthy(ms), restore_request: Some(r), ..f })
        ) {
            let d = decide(&f);
            let ClusterFacts::Healthy(view) = &f.cluster else { unreachable!() };
            let ours_unstarted = f.data.formation.is_some()
                && view.members.iter().any(|m| {
                    (m.peer_urls.contains(&f.peer_url) || (!m.name.is_empty() && m.name == f.name))
                        && m.client_urls.is_empty()
                });
            prop_assert!(!is_bootstrap(&d.action) || ours_unstarted, "{:?}: {}", d.action, d.reason());
        }

        #[test]
        fn never_bootstrap_while_an_initial_peer_is_unaccounted_for(
            f in an_initial_peer_is_unaccounted_for()
        ) {
            // A one-pod set has no initial peer to wait for.
            prop_assume!(f.peers.iter().any(|p| p.ordinal < f.replicas));
            // A half-started formation that counted on us is the one exception.
            prop_assume!(!peer_holds_a_token_with_our_nonce(&f));
            let d = decide(&f);
            prop_assert!(!is_bootstrap(&d.action), "{:?}: {}", d.action, d.reason());
        }

        #[test]
        fn empty_volume_never_restarts_or_sets_aside(
            f in any_facts().prop_map(|f| Facts { data: DataDirState { wal: WalState::None, ..f.data.clone() }, ..f })
        ) {
            let d = decide(&f);
            prop_assert!(
                !matches!(d.action, Action::Restart | Action::SetAside { .. } | Action::Recover { .. }),
                "{:?}: {}", d.action, d.reason()
            );
        }

        #[test]
        fn every_action_carries_what_it_needs(f in any_facts()) {
            let d = decide(&f);
            let view = match &f.cluster {
                ClusterFacts::Healthy(v) => Some(v),
                ClusterFacts::NotReached { .. } => None,
            };
            match &d.action {
                Action::Join { via } | Action::Replace { via, .. } => {
                    prop_assert_eq!(Some(via), view.map(|v| &v.source), "{:?}", d);
                }
                Action::Resume { member_id, members } => {
                    prop_assert_eq!(Some(members), view.map(|v| &v.members));
                    prop_assert!(members.iter().any(|m| m.id == *member_id));
                }
                Action::Bootstrap(Bootstrap::Start { nonce, token, .. }) => {
                    prop_assert!(!token.is_empty(), "{:?}", d);
                    // A token agreed earlier is the one this pod wrote; any other includes
                    // this pod's nonce at its ordinal.
                    let agreed = f.data.formation.as_ref().and_then(|m| m.token.as_ref());
                    if agreed != Some(token) {
                        prop_assert_eq!(token.split('.').nth(f.ordinal as usize), Some(nonce.as_str()), "{:?}", d);
                    }
                }
                _ => {}
            }
        }

        /// No new cluster is prepared or formed while the store has not said what it
        /// starts from (not asked, unreachable, snapshots there but none this pod may
        /// restore): never an empty cluster in place of a backup. Only a formation this pod
        /// already agreed to (its snapshot chosen then) goes on.
        #[test]
        fn no_new_cluster_while_the_backup_store_cannot_say_what_it_holds(f in any_facts()) {
            let d = decide(&f);
            if store_says_what_a_new_cluster_starts_from(&f) {
                return Ok(());
            }
            match &d.action {
                Action::Bootstrap(Bootstrap::Prepare { .. }) => {
                    prop_assert!(false, "prepared a new cluster the store said nothing about ({:?}): {}", f.backups, d.reason());
                }
                Action::Bootstrap(Bootstrap::Start { token, .. }) => prop_assert!(
                    starts_a_formation_it_agreed_to(&f, token),
                    "formed cluster {} the store said nothing about ({:?}): {}", token, f.backups, d.reason()
                ),
                _ => {}
            }
            // And the reason agrees.
            prop_assert!(!matches!(d.why, Why::ReadyToPrepare { .. } | Why::FormNew { .. }), "{:?}", d);
        }

        #[test]
        fn a_resumed_member_never_started_before(f in any_facts()) {
            let d = decide(&f);
            if let (Action::Resume { member_id, .. }, ClusterFacts::Healthy(view)) = (&d.action, &f.cluster) {
                let m = view.members.iter().find(|m| m.id == *member_id);
                prop_assert!(m.is_some_and(|m| m.client_urls.is_empty()), "{:?} from {:?}", d, view.members);
            } else {
                prop_assert!(!matches!(d.action, Action::Resume { .. }), "{:?}", d);
            }
        }

        #[test]
        fn unresolved_own_name_allows_nothing_but_wait_set_aside_or_prepare(
            f in (any_facts(), any::<bool>()).prop_map(|(f, failed)| Facts {
                own_dns: if failed { Lookup::Failed("i/o timeout".into()) } else { Lookup::NotFound },
                ..f
            })
        ) {
            let d = decide(&f);
            prop_assert!(
                matches!(
                    d.action,
                    Action::Wait
                        | Action::SetAside { .. }
                        | Action::Bootstrap(Bootstrap::Prepare { .. })
                ),
                "{:?}: {}", d.action, d.reason()
            );
        }

        /// Nothing sets aside the data of a member the cluster still lists (by its ID, in
        /// its cluster) but a rebuild request this pod's sidecar holds for that very member
        /// whose proof stands against the voters listed now: a strict majority of them
        /// answered one hash and this member another
        /// (`a_majority_proves_this_member_diverged`, from the rule, not from `proves`).
        /// A request without such a proof (no majority, silence, mixed compactions, a
        /// forged verdict, another member named, a membership changed since) restarts it.
        /// An operator's restore of the whole cluster, and a pod an operator made leave,
        /// set data aside by rules of their own
        /// (`a_restore_request_this_pod_cannot_see_usable_never_sets_data_aside`,
        /// `a_pod_that_left_only_waits_or_sets_its_data_aside_once_its_member_is_removed`).
        #[test]
        fn a_listed_members_data_is_set_aside_only_when_a_majority_proves_it_diverged(
            f in any_facts()
        ) {
            let d = decide(&f);
            if let Action::SetAside { why } = &d.action {
                let operators = match why {
                    SetAsideWhy::RestoreRequested => f.restore_request.is_some(),
                    SetAsideWhy::Left => f.data.left.is_some(),
                    _ => false,
                };
                if (lists_this_volumes_member(&f) && !operators) || *why == SetAsideWhy::Diverged {
                    prop_assert!(
                        *why == SetAsideWhy::Diverged && a_majority_proves_this_member_diverged(&f),
                        "set aside ({}) the data of member {:x?} without a majority's proof ({:?}): {}",
                        why.slug(), f.data.wal_identity(), f.rebuild_request, d.reason()
                    );
                }
            }
        }

        /// A member being rebuilt (its sidecar holds the request for this volume's member)
        /// does not start etcd on its diverged data again while no cluster answers.
        #[test]
        fn a_member_being_rebuilt_never_restarts_on_its_data_while_no_cluster_answers(
            f in any_facts()
        ) {
            let held = f.rebuild_request.as_ref().is_some_and(|r| {
                f.data.wal_identity().is_some_and(|w| w.member_id == r.member)
            });
            if held && matches!(f.cluster, ClusterFacts::NotReached { .. }) {
                let d = decide(&f);
                prop_assert!(d.action != Action::Restart, "{}", d.reason());
            }
        }

        #[test]
        fn decide_is_deterministic(f in any_facts()) {
            prop_assert_eq!(decide(&f), decide(&f.clone()));
        }

        #[test]
        fn every_decision_gives_a_reason(f in any_facts()) {
            prop_assert!(!decide(&f).reason().trim().is_empty());
        }
    }
}

// ---------------------------------------------------------------------------------------
// Upgrades: a release that may not join waits with its reason; unknown holds nothing.
// ---------------------------------------------------------------------------------------

fn release(major: u32, minor: u32, patch: u32) -> EtcdVersion {
    EtcdVersion {
        major,
        minor,
        patch,
    }
}

/// This pod starts `binary`; peers 0 and 2 run `server` in a cluster at `cluster`.
fn versions(
    binary: EtcdVersion,
    server: EtcdVersion,
    cluster: Option<EtcdVersion>,
) -> VersionFacts {
    VersionFacts {
        binary: Some(binary),
        peers: [0, 2]
            .iter()
            .map(|o| PeerVersion {
                name: pod(*o),
                server,
                cluster,
            })
            .collect(),
        auth_on_3_4: None,
        snapshot_age: None,
    }
}

fn restarting_member() -> Facts {
    Facts {
        data: wal_of(0xa1, CLUSTER),
        cluster: healthy_with(started_voter(0xa1, 1)),
        ..facts()
    }
}

#[test]
fn a_downgrade_below_the_cluster_version_waits_instead_of_restarting() {
    let f = Facts {
        versions: versions(release(3, 4, 23), release(3, 5, 30), Some(release(3, 5, 0))),
        ..restarting_member()
    };
    let d = decide(&f);
    assert_waits(
        &d,
        &[
            "etcd 3.4.23 cannot join a cluster at version 3.5",
            "says so",
            "decided: restart",
        ],
    );
}

#[test]
fn a_rolling_upgrade_one_minor_up_restarts() {
    let f = Facts {
        versions: versions(release(3, 5, 30), release(3, 4, 23), Some(release(3, 4, 0))),
        ..restarting_member()
    };
    assert_eq!(decide(&f).action, Action::Restart);
}

/// With backups, the first pod on a newer minor release starts only once the store holds a
/// verified snapshot under a minute old: otherwise it takes one through the member that
/// answered, or, when the store cannot be listed, waits saying so.
#[test]
fn with_backups_the_first_member_of_a_newer_minor_release_starts_after_a_fresh_snapshot() {
    let upgrade = |age: Option<Result<Option<u64>, String>>| Facts {
        versions: VersionFacts {
            snapshot_age: age,
            ..versions(release(3, 5, 30), release(3, 4, 23), Some(release(3, 4, 0)))
        },
        ..restarting_member()
    };
    let source = match &restarting_member().cluster {
        ClusterFacts::Healthy(v) => v.source.clone(),
        ClusterFacts::NotReached { .. } => unreachable!(),
    };
    for age in [Ok(None), Ok(Some(61)), Ok(Some(1800))] {
        let d = decide(&upgrade(Some(age.clone())));
        assert_eq!(
            d.action,
            Action::Snapshot {
                via: source.clone()
            },
            "{age:?}: {}",
            d.reason()
        );
        assert!(
            d.reason()
                .contains("the first member of 3.5 while the cluster runs 3.4")
                && d.reason().contains("decided: restart"),
            "{}",
            d.reason()
        );
    }
    assert_eq!(decide(&upgrade(Some(Ok(Some(60))))).action, Action::Restart);
    let down = decide(&upgrade(Some(Err("connection refused".into()))));
    assert_waits(
        &down,
        &[
            "the store cannot be listed (connection refused)",
            "decided: restart",
        ],
    );
    // No cluster answered: nothing to take it through.
    let alone = Facts {
        cluster: ClusterFacts::NotReached { tried: vec![] },
        ..upgrade(Some(Ok(None)))
    };
    assert_waits(
        &decide(&alone),
        &["no live member answers to take one through"],
    );
    // Without backups (not asked), or once a peer runs 3.5 (not the first): no snapshot.
    assert_eq!(decide(&upgrade(None)).action, Action::Restart);
    let second = Facts {
        versions: VersionFacts {
            snapshot_age: Some(Ok(None)),
            peers: vec![
                PeerVersion {
                    name: pod(0),
                    server: release(3, 4, 23),
                    cluster: Some(release(3, 4, 0)),
                },
                PeerVersion {
                    name: pod(2),
                    server: release(3, 5, 30),
                    cluster: Some(release(3, 4, 0)),
                },
            ],
            ..versions(release(3, 5, 30), release(3, 4, 23), Some(release(3, 4, 0)))
        },
        ..restarting_member()
    };
    assert_eq!(decide(&second).action, Action::Restart);
}

#[test]
fn a_3_4_binary_may_return_while_the_cluster_version_is_still_3_4() {
    let f = Facts {
        versions: versions(release(3, 4, 23), release(3, 5, 30), Some(release(3, 4, 0))),
        ..restarting_member()
    };
    assert_eq!(decide(&f).action, Action::Restart);
}

#[test]
fn a_skipped_minor_release_waits() {
    let f = Facts {
        versions: versions(release(3, 6, 1), release(3, 4, 23), Some(release(3, 4, 0))),
        ..restarting_member()
    };
    assert_waits(
        &decide(&f),
        &["one minor release at a time", "to 3.5 first"],
    );
}

#[test]
fn an_empty_3_6_pod_does_not_join_members_before_3_5_26() {
    let f = Facts {
        cluster: healthy_without_us(),
        versions: versions(release(3, 6, 1), release(3, 5, 25), Some(release(3, 5, 0))),
        ..facts()
    };
    let d = decide(&f);
    assert_waits(
        &d,
        &["runs etcd 3.5.25", "3.5.26 or newer", "decided: join"],
    );
}

#[test]
fn a_restart_with_data_is_not_held_by_silent_peers_or_an_unknown_binary() {
    let silent = Facts {
        data: wal_of(0xa1, CLUSTER),
        versions: VersionFacts {
            binary: Some(release(3, 4, 23)),
            peers: vec![],
            auth_on_3_4: None,
            snapshot_age: None,
        },
        ..facts()
    };
    assert_eq!(decide(&silent).action, Action::Restart);
    let unknown = Facts {
        versions: VersionFacts {
            binary: None,
            ..versions(release(3, 4, 23), release(3, 5, 30), Some(release(3, 5, 0)))
        },
        ..restarting_member()
    };
    assert_eq!(decide(&unknown).action, Action::Restart);
}

#[test]
fn a_restart_while_the_cluster_version_is_still_unsettled_3_0_is_not_held() {
    // etcd reports 3.0 until its leader settles the version, and never while a member is
    // down: the pod that is down must not wait for it.
    let f = Facts {
        versions: versions(release(3, 5, 30), release(3, 5, 30), Some(release(3, 0, 0))),
        ..restarting_member()
    };
    assert_eq!(decide(&f).action, Action::Restart);
}
