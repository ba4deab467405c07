//! Generator 3 of the chaos schedules: after some ordinary faults, one disaster — every
//! volume lost (the cluster must come back from its newest usable backup), or a majority of
//! volumes lost for good with every pod down (recovered from the survivor by
//! `etcd-steward recover --yes` or by the sidecars' `--auto-recover-after`) — and the
//! checker of what it left ([`DisasterSeen::violations`]). Generator 4 draws from the same
//! two and a third: every volume lost, the pods started with a backup key that opens no
//! snapshot (they must wait, forming nothing), then with the right key on the same volumes
//! (they must come back from the newest backup).

use std::fmt;
use std::path::Path;
use std::time::Duration;

use etcd_client::GetOptions;

use crate::backup_taken::BackupTaken;
use crate::bounds::RECOVERY_BOUND;
use crate::loopback::Set;
use crate::rng::Rng;
use crate::writer::{write_key, Writer, WriterReport};

/// The one disaster of a generator-3 schedule, struck once its ordinary faults are healed
/// and every pod is a ready voter again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disaster {
    /// After a verified backup (taken by the runner while the writer goes on), every pod
    /// killed and its volume emptied, then every pod started again.
    LoseEveryVolume,
    /// With the writer held and pod `kept` serving its last acknowledged write, every pod
    /// killed and every volume but `kept`'s emptied; every pod started again, then the
    /// majority recovered from `kept`: by `recover --yes` run in pod `recover_in`, or
    /// (`None`) by the sidecars themselves (`--auto-recover-after`, [`AUTO_RECOVER_AFTER`]).
    LoseMajority {
        /// The pod whose volume survives.
        kept: u32,
        /// Where `recover --yes` runs (an emptied pod); `None`: the sidecars recover.
        recover_in: Option<u32>,
    },
    /// As [`Disaster::LoseEveryVolume`], with encrypted backups; the pods first started
    /// with a key that opens none of them (every pod must wait, saying so, and form
    /// nothing), then killed and started with the right key on the same volumes.
    WrongKeyThenRight,
}

/// `--auto-recover-after` of the schedules whose sidecars recover by themselves.
pub const AUTO_RECOVER_AFTER: &str = "--auto-recover-after=5s";

/// The product option that makes a restore jump the revision past any served before the
/// loss (on by default). The revision check runs whenever the etcd release under test can
/// jump ([`crate::etcd::release_can_jump`]: etcdutl 3.5.30 can; 3.5.1's and 3.4's etcdctl
/// cannot, and the product restores without a jump with them and says so), decided from
/// the release, never from a `--help` text.
pub const BUMP_OPTION: &str = "--restore-bump-revision";

impl Disaster {
    /// A disaster drawn from `rng`, on a set of `pods` pods.
    pub fn draw(rng: &mut Rng, pods: u32) -> Disaster {
        if rng.below(2) == 0 {
            return Disaster::LoseEveryVolume;
        }
        let kept = rng.below(u64::from(pods)) as u32;
        let recover_in = match rng.below(2) {
            0 => None,
            _ => Some((kept + 1 + rng.below(u64::from(pods) - 1) as u32) % pods),
        };
        Disaster::LoseMajority { kept, recover_in }
    }

    /// Generator 4's draw: [`Disaster::draw`]'s two, or (one in three)
    /// [`Disaster::WrongKeyThenRight`].
    pub fn draw_with_keys(rng: &mut Rng, pods: u32) -> Disaster {
        match rng.below(3) {
            0 => Disaster::WrongKeyThenRight,
            _ => Disaster::draw(rng, pods),
        }
    }

    /// Whether the cluster must come back from a backup (every volume lost).
    pub fn restores(&self) -> bool {
        matches!(
            self,
            Disaster::LoseEveryVolume | Disaster::WrongKeyThenRight
        )
    }

    /// Which pods lose their volume.
    pub fn wiped(&self, pods: u32) -> Vec<u32> {
        match self {
            Disaster::LoseEveryVolume | Disaster::WrongKeyThenRight => (0..pods).collect(),
            Disaster::LoseMajority { kept, .. } => (0..pods).filter(|o| o != kept).collect(),
        }
    }
}

impl fmt::Display for Disaster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Disaster::LoseEveryVolume => {
                write!(f, "after a verified backup, lose every pod's volume")
            }
            Disaster::WrongKeyThenRight => write!(
                f,
                "after a verified encrypted backup, lose every pod's volume; start the pods with a key that opens no backup, then with the right one"
            ),
            Disaster::LoseMajority {
                kept,
                recover_in: Some(r),
            } => write!(
                f,
                "with every pod down, lose every volume but pod {kept}'s; `recover --yes` in pod {r}"
            ),
            Disaster::LoseMajority {
                kept,
                recover_in: None,
            } => write!(
                f,
                "with every pod down, lose every volume but pod {kept}'s; the sidecars recover by themselves ({AUTO_RECOVER_AFTER})"
            ),
        }
    }
}

/// A verified snapshot in the backup store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBackup {
    /// Its name (`<time>-r<revision>`).
    pub name: String,
    /// Its manifest's revision: the snapshot holds at least this revision.
    pub revision: i64,
}

/// The verified snapshots of the `file://` store at `store` (its `snapshots/*.json`
/// manifests), oldest first.
pub fn stored_backups(store: &Path) -> Vec<StoredBackup> {
    let Ok(entries) = std::fs::read_dir(store.join("snapshots")) else {
        return Vec::new();
    };
    let mut found: Vec<StoredBackup> = entries
        .filter_map(std::result::Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .filter(|m| m["verified"].as_bool() == Some(true))
        .filter_map(|m| {
            Some(StoredBackup {
                name: m["name"].as_str()?.to_string(),
                revision: m["revision"].as_i64()?,
            })
        })
        .collect();
    found.sort_by_key(|b| b.revision);
    found
}

/// What the runner saw of the disaster, for [`DisasterSeen::violations`].
#[derive(Debug, Clone)]
pub struct DisasterSeen {
    /// What struck.
    pub disaster: Disaster,
    /// Writes `0..acked_before` were acknowledged before the pods were killed.
    pub acked_before: u64,
    /// The verified snapshots in the store when every volume was lost (empty for a lost
    /// majority, whose survivor is never restored over).
    pub backups: Vec<StoredBackup>,
    /// The cluster ID before every volume was lost (a restore gives a new one).
    pub cluster_before: Option<u64>,
    /// Per pod, how many of `w/0..acked_before` a linearizable read through it finds
    /// (`None`: no answer).
    pub held_before: Vec<Option<u64>>,
    /// Per pod, how many of the writes acknowledged after the loss it finds.
    pub held_after: Vec<Option<u64>>,
    /// Whether the etcd release under test can jump the revision
    /// ([`crate::etcd::release_can_jump`]): then the revision after a restore is checked.
    pub bump_checked: bool,
    /// Recoveries the sidecars counted (`etcd_steward_recoveries_total`, summed over
    /// pods; `None`: a sidecar did not answer).
    pub recoveries: Option<u64>,
    /// Per pod, etcd's HashKV at [`Self::hash_revision`] (`None`: no answer).
    pub hashes: Vec<Option<u32>>,
    /// The common revision the hashes were taken at.
    pub hash_revision: i64,
    /// [`Disaster::WrongKeyThenRight`]: how each pod stood while it had the wrong key.
    pub wrong_key: Vec<WrongKeySeen>,
    /// With the continuous archive: writes acknowledged before this time (writer's clock)
    /// had to come back whatever the snapshots held ([`Struck::archived_before`]).
    pub archived_before: Option<Duration>,
}

/// How a pod stood while its backup key opened no snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrongKeySeen {
    /// Its `/ready` said init waits because the configured key does not open the backup.
    pub said_why: bool,
    /// Its volume held an etcd member (`member/wal`) with the wrong key: it formed
    /// something other than the backup.
    pub formed: bool,
}

impl DisasterSeen {
    /// How many of the writes acknowledged before the loss must be back: all of them
    /// after a lost majority (the survivor served the last one); after every volume was
    /// lost, those acknowledged at or below the newest verified backup's revision.
    pub fn must_hold(&self, writes: &WriterReport) -> u64 {
        match self.disaster {
            Disaster::LoseMajority { .. } => self.acked_before,
            Disaster::LoseEveryVolume | Disaster::WrongKeyThenRight => {
                let newest = self.backups.last().map_or(0, |b| b.revision);
                held_at(writes, self.acked_before, newest).max(self.archived(writes))
            }
        }
    }

    /// How many of the writes acknowledged before the loss the archive had to hold.
    fn archived(&self, writes: &WriterReport) -> u64 {
        let Some(before) = self.archived_before else {
            return 0;
        };
        let times = &writes.acked_at[..(self.acked_before as usize).min(writes.acked_at.len())];
        times.partition_point(|t| *t < before) as u64
    }

    /// Per pod, acknowledged writes that had to survive and are missing (`None`: the
    /// reads failed).
    pub fn missing(&self, writes: &WriterReport) -> Vec<Option<u64>> {
        let must = self.must_hold(writes);
        let after = writes.acked.saturating_sub(self.acked_before);
        self.held_before
            .iter()
            .zip(&self.held_after)
            .map(|(b, a)| Some(must.saturating_sub((*b)?) + after.saturating_sub((*a)?)))
            .collect()
    }

    /// What the disaster left wrong; empty when the product kept every promise.
    pub fn violations(&self, writes: &WriterReport) -> Vec<String> {
        let mut v = Vec::new();
        match &self.disaster {
            Disaster::LoseEveryVolume => self.restore_violations(writes, &mut v),
            Disaster::WrongKeyThenRight => {
                for (o, w) in self.wrong_key.iter().enumerate() {
                    if w.formed {
                        v.push(format!(
                            "pod {o} formed a member with a backup key that opens no snapshot, instead of waiting"
                        ));
                    }
                    if !w.said_why {
                        v.push(format!(
                            "pod {o}'s /ready never said it waits because the configured key does not open the backup"
                        ));
                    }
                }
                if self.wrong_key.is_empty() {
                    v.push("the pods were never seen with the wrong key".into());
                }
                self.restore_violations(writes, &mut v);
            }
            Disaster::LoseMajority { kept, .. } => {
                match self.recoveries {
                    Some(1) => {}
                    Some(n) => v.push(format!(
                        "{n} recoveries counted after one majority was lost (pod {kept} survived): exactly one was due"
                    )),
                    None => v.push("a sidecar did not say how many recoveries it counted".into()),
                }
            }
        }
        let answered: Vec<u32> = self.hashes.iter().flatten().copied().collect();
        if answered.len() != self.hashes.len() {
            v.push(format!(
                "not every member answered HashKV at revision {}: {:?}",
                self.hash_revision, self.hashes
            ));
        } else if answered.windows(2).any(|w| w[0] != w[1]) {
            v.push(format!(
                "the members' HashKV disagree at revision {}: {:x?}",
                self.hash_revision, self.hashes
            ));
        }
        v
    }

    fn restore_violations(&self, writes: &WriterReport, v: &mut Vec<String>) {
        let Some(newest) = self.backups.last() else {
            v.push("no verified backup was in the store when every volume was lost".into());
            return;
        };
        let must = self.must_hold(writes);
        let held = self.held_before.iter().flatten().copied().min();
        match held {
            Some(0) if must > 0 => v.push(format!(
                "the cluster came back empty after every volume was lost, not from backup {} (revision {})",
                newest.name, newest.revision
            )),
            Some(h) if h < must && self.archived(writes) == must => v.push(format!(
                "the cluster came back holding {h} of the {must} writes acknowledged more than {:?} before every volume was lost: the continuous archive lost {} acknowledged writes",
                ARCHIVE_INTERVAL + Duration::from_secs(1),
                must - h
            )),
            Some(h) if h < must => {
                // The newest backup whose writes the cluster holds: the one it came from.
                let from = self
                    .backups
                    .iter()
                    .rev()
                    .find(|b| held_at(writes, self.acked_before, b.revision) <= h);
                v.push(match from {
                    Some(b) => format!(
                        "the cluster came back from an older backup, {} (revision {}), not the newest verified one, {} (revision {})",
                        b.name, b.revision, newest.name, newest.revision
                    ),
                    None => format!(
                        "the cluster came back holding {h} of the {must} writes the newest verified backup {} (revision {}) holds",
                        newest.name, newest.revision
                    ),
                });
            }
            _ => {}
        }
        if self.bump_checked {
            let before = writes
                .revisions
                .iter()
                .take(self.acked_before as usize)
                .copied()
                .max()
                .unwrap_or(0);
            match writes.revisions.get(self.acked_before as usize) {
                Some(first) if *first <= before => v.push(format!(
                    "the restored cluster acknowledged a write at revision {first}, not above revision {before} served before the loss: the revision went backwards"
                )),
                _ => {}
            }
        }
    }
}

/// How many of writes `0..acked` were acknowledged at or below `revision` (the writer
/// writes one after another: revisions grow with the index).
fn held_at(writes: &WriterReport, acked: u64, revision: i64) -> u64 {
    let before = &writes.revisions[..(acked as usize).min(writes.revisions.len())];
    before.partition_point(|r| *r <= revision) as u64
}

/// The continuous archive's option.
pub const ARCHIVE_OPTION: &str = "--archive-interval";
/// The archive interval the disaster schedules run with.
pub const ARCHIVE_INTERVAL: Duration = Duration::from_secs(1);

/// Whether `steward` has the continuous archive (its `sidecar --help` lists
/// [`ARCHIVE_OPTION`]): then a loss of every volume must keep every write acknowledged
/// more than the interval and a second before it.
pub fn archives(steward: &Path) -> bool {
    std::process::Command::new(steward)
        .args(["sidecar", "--help"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(ARCHIVE_OPTION))
}

/// The release's offline tool beside its etcd: etcdutl (3.5), else etcdctl (3.4).
fn offline_tool(set: &Set) -> std::path::PathBuf {
    let etcd = set.etcd_bin();
    match etcd.with_file_name("etcdutl") {
        t if t.exists() => t,
        _ => etcd.with_file_name("etcdctl"),
    }
}

/// The options a disaster schedule's pods run with: backups to the set's `file://`
/// store (restored when every volume is lost; periodic ones rare, so the runner's are the
/// newest), and the sidecars' own recovery when the disaster wants it.
pub fn options(set: &Set, disaster: &Disaster) -> Vec<String> {
    let tool = offline_tool(set);
    let mut args = vec![
        format!("--backup-url={}", store_url(set)),
        format!("--etcdutl-bin={}", tool.display()),
        format!(
            "--backup-scratch-dir={}",
            set.root().join("scratch-{ordinal}").display()
        ),
        "--backup-interval=1h".into(),
        "--restore=latest".into(),
    ];
    // The agent refuses a tool that cannot jump unless the jump is off.
    if !crate::etcd::release_can_jump(crate::etcd::release(set.etcd_bin())) {
        args.push(format!("{BUMP_OPTION}=0"));
    }
    if archives(set.steward_bin()) {
        args.push(format!("{ARCHIVE_OPTION}={}s", ARCHIVE_INTERVAL.as_secs()));
    }
    if *disaster == Disaster::WrongKeyThenRight {
        args.push(key_option(&keys(set).right));
    }
    if matches!(
        disaster,
        Disaster::LoseMajority {
            recover_in: None,
            ..
        }
    ) {
        args.push(AUTO_RECOVER_AFTER.into());
    }
    args
}

/// The two backup keys of a [`Disaster::WrongKeyThenRight`] schedule.
pub struct Keys {
    /// The key the backups are encrypted to.
    pub right: std::path::PathBuf,
    /// A key that opens none of them.
    pub wrong: std::path::PathBuf,
}

/// The set's two backup keys, made once by `etcd-steward backup --generate-key`.
pub fn keys(set: &Set) -> Keys {
    let dir = set.root().join("keys");
    let keys = Keys {
        right: dir.join("right.txt"),
        wrong: dir.join("wrong.txt"),
    };
    for path in [&keys.right, &keys.wrong] {
        if path.exists() {
            continue;
        }
        let out = std::process::Command::new(set.steward_bin())
            .args(["backup", "--generate-key"])
            .output();
        match out {
            Ok(out) if out.status.success() && !out.stdout.is_empty() => {
                let written =
                    std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(path, out.stdout));
                if let Err(e) = written {
                    panic!("chaos: writing the backup key {}: {e}", path.display());
                }
            }
            other => panic!("chaos: `etcd-steward backup --generate-key` failed: {other:?}"),
        }
    }
    keys
}

fn key_option(path: &Path) -> String {
    format!("--backup-encryption-key-file={}", path.display())
}

/// The set's `file://` backup store.
pub fn store_url(set: &Set) -> String {
    format!("file://{}", set.root().join("backups").display())
}

/// What [`strike`] did, for [`observe`] once everything is healed.
#[derive(Debug)]
pub struct Struck {
    /// What struck.
    pub disaster: Disaster,
    /// Writes `0..acked_before` were acknowledged before the pods were killed.
    pub acked_before: u64,
    /// The verified snapshots in the store when every volume was lost.
    pub backups: Vec<StoredBackup>,
    /// The cluster ID before the disaster.
    pub cluster_before: Option<u64>,
    /// The runner's own backup before every volume was lost.
    pub backup: Option<BackupTaken>,
    /// The member IDs of the volumes lost.
    pub lost_ids: Vec<u64>,
    /// [`Disaster::WrongKeyThenRight`]: how each pod stood with the wrong key.
    pub wrong_key: Vec<WrongKeySeen>,
    /// How long the pods ran with the wrong key (writes are refused meanwhile, on
    /// purpose: the outage it explains).
    pub held: Duration,
    /// With the continuous archive (`--archive-interval`): the writes it had to hold, those
    /// acknowledged before this time on the writer's clock (the loss, less the interval and
    /// a second).
    pub archived_before: Option<Duration>,
}

/// How long the set may take to settle before the disaster, and the survivor to serve the
/// last acknowledged write.
const SETTLE: Duration = Duration::from_secs(30);

/// Strikes `disaster` on `set` (every pod a ready voter) under `writer`, starts every pod
/// again, and (for `recover --yes`) runs the recovery. Panics when the disaster cannot be
/// made as meant (the set never settled, no backup could be taken, a volume could not be
/// emptied): a run that did not make its disaster proves nothing.
pub async fn strike(set: &mut Set, disaster: &Disaster, writer: &Writer) -> Struck {
    let pods: Vec<u32> = (0..set.replicas).collect();
    eprintln!("chaos: disaster: {disaster}");
    // Polled by hand: restarting exited containers meanwhile needs `&mut`.
    let deadline = tokio::time::Instant::now() + RECOVERY_BOUND;
    while !set.all_linearizable(&pods, pods.len()).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "chaos: the set never settled before the disaster ({disaster})\n{}",
            set.dump()
        );
        let _ = set.restart_exited();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cluster_before = set.cluster_id(0).await.ok();
    let mut lost_ids = Vec::new();
    for o in disaster.wiped(set.replicas) {
        if let Ok(id) = set.member_id(o).await {
            lost_ids.push(id);
        }
    }
    let mut backup = None;
    let archived = archives(set.steward_bin());
    let mut lost_at = None;
    let acked_before = match disaster {
        Disaster::LoseEveryVolume | Disaster::WrongKeyThenRight => {
            // The runner's backup, while the writer goes on: writes after it are lost
            // with the volumes (what a backup cannot hold).
            let taken = backup_now(set, 0).await;
            assert!(
                taken.exited_ok && taken.verified,
                "chaos: the backup before every volume is lost failed: {taken:?}\n{}",
                set.dump()
            );
            backup = Some(taken);
            // Writes after the backup: lost with the volumes, unless the archive holds them
            // (then long enough after the backup that the archive must hold some).
            let after = if archived {
                ARCHIVE_INTERVAL * 4
            } else {
                Duration::from_millis(300)
            };
            tokio::time::sleep(after).await;
            lost_at = Some(writer.elapsed());
            for o in &pods {
                let _ = set.kill(*o).await;
            }
            writer.acked()
        }
        Disaster::LoseMajority { kept, .. } => {
            let acked = writer.pause(Duration::from_secs(10)).await;
            let last = write_key(acked.saturating_sub(1));
            let kept = *kept;
            let served = crate::wait_until(
                SETTLE,
                &format!("pod {kept} serving {last} on a serializable read"),
                || async {
                    let Ok(mut c) = set.client(kept).await else {
                        return false;
                    };
                    let opts = GetOptions::new().with_serializable();
                    c.get(last.as_str(), Some(opts))
                        .await
                        .is_ok_and(|r| !r.kvs().is_empty())
                },
            )
            .await;
            if let Err(e) = served {
                panic!("chaos: the survivor never caught up: {e}\n{}", set.dump());
            }
            for o in &pods {
                let _ = set.kill(*o).await;
            }
            writer.resume();
            acked
        }
    };
    let backups = match disaster {
        Disaster::LoseEveryVolume | Disaster::WrongKeyThenRight => {
            let url = store_url(set);
            stored_backups(Path::new(url.trim_start_matches("file://")))
        }
        Disaster::LoseMajority { .. } => Vec::new(),
    };
    for o in disaster.wiped(set.replicas) {
        if let Err(e) = set.wipe(o) {
            panic!("chaos: pod {o}'s volume could not be emptied: {e}");
        }
    }
    let (wrong_key, held) = match disaster {
        Disaster::WrongKeyThenRight => with_the_wrong_key(set).await,
        _ => (Vec::new(), Duration::ZERO),
    };
    for o in &pods {
        let _ = set.start(*o);
    }
    if let Disaster::LoseMajority {
        recover_in: Some(r),
        ..
    } = disaster
    {
        // `recover` plans from the pods' reports (a silent pod makes it refuse): every
        // sidecar answering first, bounded.
        let answering = crate::wait_until(SETTLE, "every sidecar answering", || async {
            for o in 0..set.replicas {
                if set.http(o, "/healthz").await.is_none() {
                    return false;
                }
            }
            true
        })
        .await;
        if let Err(e) = answering {
            panic!("chaos: {e} before `recover --yes`\n{}", set.dump());
        }
        let cmd = set.steward_in(*r, &["recover", "--yes", "--timeout=80s"]);
        let out = tokio::time::timeout(RECOVERY_BOUND, set.run_restarting(cmd)).await;
        match out {
            Ok(out) if out.status.success() => eprintln!("chaos: recover --yes in pod {r} done"),
            Ok(out) => eprintln!(
                "chaos: recover --yes in pod {r} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(_) => {
                eprintln!("chaos: recover --yes in pod {r} did not end in {RECOVERY_BOUND:?}")
            }
        }
    }
    Struck {
        disaster: disaster.clone(),
        acked_before,
        backups,
        cluster_before,
        backup,
        lost_ids,
        wrong_key,
        held,
        archived_before: lost_at
            .filter(|_| archived)
            .map(|t| t.saturating_sub(ARCHIVE_INTERVAL + Duration::from_secs(1))),
    }
}

/// How long the pods have, with the wrong key, to say that they wait and why.
const WRONG_KEY_WAIT: Duration = Duration::from_secs(45);

/// Starts every pod (their volumes emptied) with a key that opens no backup; waits until
/// each one's `/ready` says why it waits (bounded), notes whether any formed a member, and
/// kills them again with the right key back in their options. Returns how each pod stood,
/// and how long this took.
async fn with_the_wrong_key(set: &mut Set) -> (Vec<WrongKeySeen>, Duration) {
    let started = tokio::time::Instant::now();
    let keys = keys(set);
    let (right, wrong) = (key_option(&keys.right), key_option(&keys.wrong));
    let swap = |set: &mut Set, from: &str, to: &str| {
        for a in &mut set.extra_args {
            if a == from {
                *a = to.to_string();
            }
        }
    };
    swap(set, &right, &wrong);
    let pods: Vec<u32> = (0..set.replicas).collect();
    for o in &pods {
        let _ = set.start(*o);
    }
    let says_why = |body: &str| body.contains("init is waiting") && body.contains("do not open");
    let mut said = vec![false; pods.len()];
    while tokio::time::Instant::now() < started + WRONG_KEY_WAIT && said.contains(&false) {
        for o in &pods {
            if let Some((503, body)) = set.http(*o, "/ready").await {
                said[*o as usize] |= says_why(&body);
            }
        }
        let _ = set.restart_exited();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let seen: Vec<WrongKeySeen> = pods
        .iter()
        .map(|o| WrongKeySeen {
            said_why: said[*o as usize],
            formed: set.data_dir(*o).join("member/wal").exists(),
        })
        .collect();
    eprintln!("chaos: with the wrong key: {seen:?}; now the right key");
    for o in &pods {
        let _ = set.kill(*o).await;
    }
    swap(set, &wrong, &right);
    (seen, started.elapsed())
}

/// `etcd-steward backup` through pod `o` into the set's store, retried twice.
pub async fn backup_now(set: &Set, o: u32) -> BackupTaken {
    let mut last = None;
    for _ in 0..3 {
        let run = set.steward_in(o, &["backup"]).kill_on_drop(true).output();
        let out = tokio::time::timeout(crate::bounds::BACKUP_TIME_OUT, run).await;
        let taken = BackupTaken::from_output(o, false, out.ok().and_then(std::result::Result::ok));
        if taken.exited_ok && taken.verified {
            return taken;
        }
        last = Some(taken);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    last.unwrap_or_else(|| unreachable!())
}

/// How the pods stand after the disaster, everything healed and the writer stopped.
pub async fn observe(set: &Set, struck: Struck, writes: &WriterReport) -> DisasterSeen {
    let pods: Vec<u32> = (0..set.replicas).collect();
    let mut held_before = Vec::new();
    let mut held_after = Vec::new();
    for o in &pods {
        held_before.push(count(set, *o, 0, struck.acked_before).await);
        held_after.push(count(set, *o, struck.acked_before, writes.acked).await);
    }
    let recoveries = match struck.disaster {
        Disaster::LoseMajority { .. } => {
            // The sidecars count recoveries from their journals, each tick: bounded.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let sum = recoveries(set, &pods).await;
                if sum.is_some_and(|n| n >= 1) || tokio::time::Instant::now() >= deadline {
                    break sum;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
        Disaster::LoseEveryVolume | Disaster::WrongKeyThenRight => None,
    };
    let (hash_revision, hashes) = hashes(set, &pods).await;
    DisasterSeen {
        disaster: struck.disaster,
        acked_before: struck.acked_before,
        backups: struck.backups,
        cluster_before: struck.cluster_before,
        held_before,
        held_after,
        bump_checked: crate::etcd::release_can_jump(crate::etcd::release(set.etcd_bin())),
        recoveries,
        hashes,
        hash_revision,
        wrong_key: struck.wrong_key,
        archived_before: struck.archived_before,
    }
}

/// How many of the writer's keys `w/from..w/to` a linearizable read through pod `o` finds.
async fn count(set: &Set, o: u32, from: u64, to: u64) -> Option<u64> {
    if from >= to {
        return Some(0);
    }
    let mut c = set.client(o).await.ok()?;
    let opts = GetOptions::new()
        .with_range(write_key(to))
        .with_count_only();
    let r = c.get(write_key(from), Some(opts)).await.ok()?;
    Some(r.count().max(0) as u64)
}

async fn recoveries(set: &Set, pods: &[u32]) -> Option<u64> {
    let mut sum = 0;
    for o in pods {
        let (200, text) = set.http(*o, "/metrics").await? else {
            return None;
        };
        sum += crate::client::sample(&text, "etcd_steward_recoveries_total").unwrap_or(0.0) as u64;
    }
    Some(sum)
}

/// Every member's HashKV at one revision every member has applied (the writer stopped):
/// the revision pod 0 reports, each member asked until it answers (bounded).
async fn hashes(set: &Set, pods: &[u32]) -> (i64, Vec<Option<u32>>) {
    let revision = match set.status(pods[0]).await {
        Ok(s) => s.header().map_or(0, |h| h.revision()),
        Err(_) => 0,
    };
    let mut out = Vec::new();
    for o in pods {
        // Bounded: a member still applying the revision answers once it has.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let hash = loop {
            if let Ok(mut c) = set.client(*o).await {
                if let Ok(r) = c.hash_kv(revision).await {
                    break Some(r.hash());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        out.push(hash);
    }
    (revision, out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn writes(revisions: Vec<i64>) -> WriterReport {
        WriterReport {
            acked: revisions.len() as u64,
            failures: 0,
            max_gap: Duration::ZERO,
            max_gap_at: Duration::ZERO,
            refusals: Vec::new(),
            last_error: String::new(),
            // One write a second.
            acked_at: (0..revisions.len() as u64)
                .map(Duration::from_secs)
                .collect(),
            revisions,
        }
    }

    fn restored(held_before: u64, held_after: u64) -> DisasterSeen {
        DisasterSeen {
            disaster: Disaster::LoseEveryVolume,
            acked_before: 10,
            // Writes 0..10 at revisions 2..=11; backups at revisions 5 (writes 0..4) and 9
            // (writes 0..8).
            backups: vec![
                StoredBackup {
                    name: "a-r5".into(),
                    revision: 5,
                },
                StoredBackup {
                    name: "b-r9".into(),
                    revision: 9,
                },
            ],
            cluster_before: Some(1),
            held_before: vec![Some(held_before); 3],
            held_after: vec![Some(held_after); 3],
            bump_checked: false,
            recoveries: None,
            hashes: vec![Some(7); 3],
            hash_revision: 20,
            wrong_key: vec![],
            archived_before: None,
        }
    }

    #[test]
    fn with_the_archive_every_write_older_than_the_interval_and_a_second_must_come_back() {
        // Ten writes a second apart (revisions 2..=11), the newest backup at revision 9
        // (writes 0..8); the loss at 9.5 s: the archive had to hold writes acknowledged
        // before 7.5 s (0..=7), which the backup already does, so 8 are due either way...
        let w = writes(vec![2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 10, 11]);
        let mut seen = restored(8, 2);
        seen.archived_before = Some(Duration::from_millis(7_500));
        assert_eq!(seen.must_hold(&w), 8);
        // ...and with the loss 2 s later, the archive had to hold writes 0..=9: all ten.
        seen.archived_before = Some(Duration::from_millis(9_500));
        assert_eq!(seen.must_hold(&w), 10);
        let v = seen.violations(&w);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("the continuous archive lost 2 acknowledged writes"),
            "{v:?}"
        );
        let all_back = DisasterSeen {
            held_before: vec![Some(10); 3],
            ..seen
        };
        assert!(
            all_back.violations(&w).is_empty(),
            "{:?}",
            all_back.violations(&w)
        );
    }

    #[test]
    fn a_restore_from_the_newest_backup_passes_and_from_an_older_one_is_named() {
        // Two writes after the loss, at revisions 10 and 11: the restored cluster (backup
        // at revision 9) went on from there.
        let w = writes(vec![2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 10, 11]);
        let newest = restored(8, 2);
        assert_eq!(newest.must_hold(&w), 8);
        assert!(
            newest.violations(&w).is_empty(),
            "{:?}",
            newest.violations(&w)
        );
        assert_eq!(newest.missing(&w), vec![Some(0); 3]);
        // The writes after the newest backup (revisions 10, 11) may be lost, no more.
        let older = restored(4, 2);
        let v = older.violations(&w);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("older backup, a-r5") && v[0].contains("b-r9"),
            "{v:?}"
        );
        assert_eq!(older.missing(&w), vec![Some(4); 3]);
        let empty = restored(0, 2);
        let v = empty.violations(&w);
        assert!(v.len() == 1 && v[0].contains("came back empty"), "{v:?}");
        let none = DisasterSeen {
            backups: vec![],
            ..restored(8, 2)
        };
        assert!(none.violations(&w)[0].contains("no verified backup"));
    }

    #[test]
    fn a_restore_that_takes_the_revision_backwards_is_caught_only_when_the_product_bumps() {
        // Restored at revision 9: the first write after it is acknowledged at revision 10,
        // below revision 11 served before the loss.
        let w = writes(vec![2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 10, 11]);
        let mut seen = restored(8, 2);
        assert!(seen.violations(&w).is_empty());
        seen.bump_checked = true;
        let v = seen.violations(&w);
        assert!(v.len() == 1 && v[0].contains("went backwards"), "{v:?}");
        let bumped = writes(vec![2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1_000_011, 1_000_012]);
        assert!(seen.violations(&bumped).is_empty());
    }

    #[test]
    fn a_lost_write_after_a_lost_majority_and_a_hashkv_disagreement_are_violations() {
        let w = writes((2..22).collect());
        let seen = DisasterSeen {
            disaster: Disaster::LoseMajority {
                kept: 1,
                recover_in: Some(0),
            },
            acked_before: 15,
            backups: vec![],
            cluster_before: Some(1),
            held_before: vec![Some(15); 3],
            held_after: vec![Some(5); 3],
            bump_checked: false,
            recoveries: Some(1),
            hashes: vec![Some(7); 3],
            hash_revision: 30,
            wrong_key: vec![],
            archived_before: None,
        };
        assert!(seen.violations(&w).is_empty(), "{:?}", seen.violations(&w));
        assert_eq!(seen.missing(&w), vec![Some(0); 3]);
        // The survivor served write 14 before the kill; a member without it lost it.
        let mut lost = seen.clone();
        lost.held_before[2] = Some(14);
        assert_eq!(lost.missing(&w), vec![Some(0), Some(0), Some(1)]);
        let mut split = seen.clone();
        split.hashes[1] = Some(8);
        let v = split.violations(&w);
        assert!(v.len() == 1 && v[0].contains("HashKV disagree"), "{v:?}");
        let mut twice = seen.clone();
        twice.recoveries = Some(2);
        let v = twice.violations(&w);
        assert!(v.len() == 1 && v[0].contains("2 recoveries"), "{v:?}");
    }

    #[test]
    fn a_pod_that_formed_or_never_said_why_with_the_wrong_key_is_a_violation() {
        let w = writes(vec![2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 10, 11]);
        let waited = WrongKeySeen {
            said_why: true,
            formed: false,
        };
        let seen = DisasterSeen {
            disaster: Disaster::WrongKeyThenRight,
            wrong_key: vec![waited; 3],
            archived_before: None,
            ..restored(8, 2)
        };
        assert!(seen.violations(&w).is_empty(), "{:?}", seen.violations(&w));
        let mut formed = seen.clone();
        formed.wrong_key[1].formed = true;
        let v = formed.violations(&w);
        assert!(v.len() == 1 && v[0].contains("pod 1 formed"), "{v:?}");
        let mut silent = seen.clone();
        silent.wrong_key[2].said_why = false;
        let v = silent.violations(&w);
        assert!(v.len() == 1 && v[0].contains("pod 2's /ready"), "{v:?}");
        let never = DisasterSeen {
            wrong_key: vec![],
            archived_before: None,
            ..seen.clone()
        };
        assert!(never.violations(&w)[0].contains("never seen with the wrong key"));
        // After the right key, the restore is checked as after any lost volumes.
        let older = DisasterSeen {
            held_before: vec![Some(4); 3],
            ..seen
        };
        assert!(older.violations(&w)[0].contains("older backup"));
    }

    #[test]
    fn the_draw_with_keys_covers_all_three_disasters() {
        let mut rng = Rng::new(5);
        let drawn: Vec<Disaster> = (0..64)
            .map(|_| Disaster::draw_with_keys(&mut rng, 3))
            .collect();
        assert!(drawn.contains(&Disaster::WrongKeyThenRight));
        assert!(drawn.contains(&Disaster::LoseEveryVolume));
        assert!(drawn
            .iter()
            .any(|d| matches!(d, Disaster::LoseMajority { .. })));
    }

    #[test]
    fn a_disaster_draw_covers_both_and_keeps_one_volume_for_a_lost_majority() {
        let mut rng = Rng::new(3);
        let drawn: Vec<Disaster> = (0..64).map(|_| Disaster::draw(&mut rng, 3)).collect();
        assert!(drawn.contains(&Disaster::LoseEveryVolume));
        for d in &drawn {
            if let Disaster::LoseMajority { kept, recover_in } = d {
                assert_eq!(d.wiped(3).len(), 2);
                assert!(!d.wiped(3).contains(kept));
                assert!(recover_in.is_none_or(|r| r != *kept), "{d}");
            }
        }
        assert!(drawn.iter().any(|d| matches!(
            d,
            Disaster::LoseMajority {
                recover_in: None,
                ..
            }
        )));
        assert!(drawn.iter().any(|d| matches!(
            d,
            Disaster::LoseMajority {
                recover_in: Some(_),
                ..
            }
        )));
    }
}
