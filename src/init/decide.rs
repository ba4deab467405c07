//! The pure heart of `init`: observed [`Facts`] in, one [`Decision`] out. No I/O, no
//! clock, no randomness (a fresh nonce is one of the facts); it reads `crate::facts` alone.
//! Every rule that keeps data safe is here, where a table of scenarios can prove it.
//!
//! A decision carries everything its action needs (the member to ask, the token to start
//! with), and a typed reason, [`Why`], that renders the sentence operators read.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::facts::{
    ActionKind, BackupFacts, ClusterFacts, ClusterView, Endpoint, Facts, Failed, Formation, Lookup,
    MemberInfo, PeerReport, Rejection, RestoreWanted, SnapshotFacts,
};

/// Why data is set aside before joining.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SetAsideWhy {
    /// The WAL belongs to another cluster than the one running.
    ForeignCluster,
    /// The WAL's member is no longer in the cluster (an operator removed it).
    RemovedMember,
    /// The WAL could not be read and the cluster has no member at this pod's URL.
    NotAMember,
    /// An operator restores the whole cluster to a snapshot (`restore --snapshot --yes`).
    RestoreRequested,
    /// This pod left the cluster (`etcd-steward leave --yes`) and its member is removed.
    Left,
}

impl SetAsideWhy {
    /// The suffix of the set-aside directory's name.
    pub fn slug(self) -> &'static str {
        match self {
            SetAsideWhy::ForeignCluster => "foreign-cluster",
            SetAsideWhy::RemovedMember => "removed-member",
            SetAsideWhy::NotAMember => "not-a-member",
            SetAsideWhy::RestoreRequested => "restore-requested",
            SetAsideWhy::Left => "left",
        }
    }
}

/// Forming a new cluster, in two steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bootstrap {
    /// Write this pod's formation marker (its nonce) so peers can see it is ready.
    Prepare { marker: Formation },
    /// Every initial pod is prepared: record the token and start etcd as a new cluster,
    /// restored from `snapshot` when there is one.
    Start {
        nonce: String,
        initial_cluster: String,
        token: String,
        snapshot: Option<String>,
    },
}

impl Bootstrap {
    /// The marker this step writes.
    pub fn marker(&self) -> Formation {
        match self {
            Bootstrap::Prepare { marker } => marker.clone(),
            Bootstrap::Start {
                nonce,
                initial_cluster,
                token,
                snapshot,
            } => Formation {
                nonce: nonce.clone(),
                initial_cluster: initial_cluster.clone(),
                token: Some(token.clone()),
                snapshot: snapshot.clone(),
            },
        }
    }

    pub fn step_name(&self) -> &'static str {
        match self {
            Bootstrap::Prepare { .. } => "prepare",
            Bootstrap::Start { .. } => "start",
        }
    }
}

/// What `init` does this round; each variant holds everything needed to do it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start etcd on this member's own data; touch no membership.
    Restart,
    /// Form a new cluster (in steps).
    Bootstrap(Bootstrap),
    /// Ask `via` to add this pod as a learner; then look again (and resume that entry).
    Join { via: Endpoint },
    /// Start as the existing, never-started member entry `member_id` of `members`.
    Resume {
        member_id: u64,
        members: Vec<MemberInfo>,
    },
    /// Ask `via` to remove the member entry left by this pod's lost volume; then join.
    Replace { stale: MemberInfo, via: Endpoint },
    /// Rename the data aside inside the volume, then join.
    SetAside { why: SetAsideWhy },
    /// Not enough evidence: wait and look again.
    Wait,
    /// Start etcd on this volume's data as a one-member cluster (`--force-new-cluster`):
    /// the recovery `id` an operator asked for, from this, the freshest surviving volume.
    /// `commit` is the WAL's commit index now (when `first`), or the one the marker records
    /// (the commit index the forced start begins from, once the WAL's commit index is moved
    /// to its last entry); a later start that finds the commit index not past it starts
    /// forced again.
    Recover {
        id: String,
        commit: u64,
        first: bool,
    },
    /// The cluster lists this member under another peer URL (the service renamed, peer TLS
    /// switched on): ask `via` to update it (MemberUpdate); the member keeps its ID and data.
    UpdatePeerUrls { member: u64, via: Endpoint },
}

impl Action {
    pub fn kind(&self) -> ActionKind {
        match self {
            Action::Restart => ActionKind::Restart,
            Action::Bootstrap(_) => ActionKind::Bootstrap,
            Action::Join { .. } => ActionKind::Join,
            Action::Resume { .. } => ActionKind::Resume,
            Action::Replace { .. } => ActionKind::Replace,
            Action::SetAside { .. } => ActionKind::SetAside,
            Action::Wait => ActionKind::Wait,
            Action::Recover { .. } => ActionKind::Recover,
            Action::UpdatePeerUrls { .. } => ActionKind::UpdatePeerUrls,
        }
    }

    /// The name users see in logs and in `init --dry-run`.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
}

/// Why no live cluster answered: one line per member tried (empty when not asked).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NotReached(pub Vec<String>);

impl std::fmt::Display for NotReached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            write!(f, " (no live cluster: {})", self.0.join("; "))
        }
    }
}

/// Why a decision was taken: the facts that explain it. `Display` renders the sentence
/// operators read; retries key on the variant ([`Why::kind`]), never on the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    // The volume holds data.
    DataAndNoClusterAnswered,
    OutnumberedByAnotherCluster {
        own: u64,
        other: u64,
        holders: Vec<String>,
        not_reached: NotReached,
    },
    ForeignCluster {
        wal_cluster: u64,
        cluster: u64,
    },
    OwnMemberListed {
        member: u64,
    },
    MemberRemoved {
        member: u64,
        cluster: u64,
    },
    UnreadableWalButListed,
    UnreadableWalNotListed,
    // The volume is empty and a cluster answers.
    NoMemberForThisPod {
        cluster: u64,
    },
    NeverStartedLearner {
        member: u64,
    },
    NeverStartedFormationMember {
        member: u64,
    },
    StaleEntry {
        member: u64,
        learner: bool,
    },
    // The volume is empty and no cluster answers.
    BeyondInitialSize {
        ordinal: u32,
        replicas: u32,
        not_reached: NotReached,
    },
    AgreedEarlier {
        token: String,
    },
    PeerStartedOurFormation {
        peer: String,
        token: String,
    },
    PeersHoldData {
        holders: Vec<String>,
    },
    NoProofYet {
        blockers: Vec<String>,
        not_reached: NotReached,
    },
    ReadyToPrepare {
        snapshot: Option<String>,
    },
    BackupStoreUnreachable {
        error: String,
    },
    NoUsableBackup {
        skipped: Vec<(String, Unusable)>,
    },
    NamedBackupUnusable {
        name: String,
        problem: Unusable,
    },
    OtherSnapshot {
        peer: String,
        theirs: Option<String>,
        ours: Option<String>,
    },
    OtherInitialCluster {
        peer: String,
        theirs: String,
        ours: String,
    },
    WaitingForPrepare {
        pods: Vec<String>,
    },
    FormNew {
        token: String,
        snapshot: Option<String>,
    },
    // A recovery from the freshest surviving volume.
    RecoveryRequested {
        id: String,
        plan: String,
    },
    RecoveryNotApplied {
        id: String,
        commit: u64,
    },
    RecoveryChoseOther {
        id: String,
        survivor: String,
    },
    RecoveryRefused {
        id: String,
        refusal: String,
    },
    RestoreRequested {
        id: String,
        snapshot: String,
    },
    LeftAndRemoved {
        member: u64,
    },
    /// A restore request stands and this volume is empty, but a cluster answers that is
    /// not this pod's formation waiting for it.
    RestoreWhileAClusterAnswers {
        id: String,
        cluster: u64,
    },
    RestoreNotSeen {
        id: String,
        snapshot: String,
        problem: String,
        then: Box<Decision>,
    },
    PeerUrlChanged {
        member: u64,
        listed: Vec<String>,
        now: String,
    },
    LeaveNotDone {
        member: u64,
        listed: bool,
    },
    Left,
    /// A leave or restore marker exists but cannot be read: what it says is unknown, so
    /// nothing is decided on the volume until someone looks.
    MarkerUnreadable {
        markers: Vec<String>,
    },
    // This pod's own name does not resolve: whatever was decided waits.
    OwnNameNotPublished {
        host: String,
        then: Box<Decision>,
    },
    OwnNameFails {
        host: String,
        error: String,
        then: Box<Decision>,
    },
    // This pod's etcd release may not join the cluster its peers run.
    VersionHeld {
        hold: super::upgrade::Hold,
        then: Box<Decision>,
    },
}

/// Identifies a [`Why`] variant, whatever its fields: what the back-off keys on.
pub type WhyKind = std::mem::Discriminant<Why>;

impl Why {
    pub fn kind(&self) -> WhyKind {
        std::mem::discriminant(self)
    }

    /// The variant's name (`NoUsableBackup`): the machine kind of a wait in `waiting.json`.
    pub fn name(&self) -> String {
        let debug = format!("{self:?}");
        debug
            .split(|c: char| !c.is_alphanumeric())
            .next()
            .unwrap_or_default()
            .to_string()
    }

    /// For a wait that lists what it still waits for (pods not prepared, peers not
    /// accounted for), how many; the back-off starts afresh when this falls, so a
    /// formation that makes progress is looked at again soon.
    pub fn outstanding(&self) -> usize {
        match self {
            Why::WaitingForPrepare { pods } => pods.len(),
            Why::NoProofYet { blockers, .. } => blockers.len(),
            Why::OwnNameNotPublished { then, .. }
            | Why::OwnNameFails { then, .. }
            | Why::VersionHeld { then, .. } => then.why.outstanding(),
            _ => 0,
        }
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::DataAndNoClusterAnswered => write!(f, "the volume holds member data and no live cluster answered: etcd starts on its data and waits for its peers"),
            Why::OutnumberedByAnotherCluster { own, other, holders, not_reached } => write!(f, "this volume holds data of cluster {own:x}, but {} hold data of cluster {other:x}: this data is not started as a cluster of its own; waiting for cluster {other:x} to answer, then it is set aside and this pod joins{not_reached}", holders.join(", ")),
            Why::ForeignCluster { wal_cluster, cluster } => write!(f, "the WAL belongs to cluster {wal_cluster:x}, but the running cluster is {cluster:x}: its data is set aside and this pod joins"),
            Why::OwnMemberListed { member } => write!(f, "the volume holds the data of member {member:x}, which the cluster lists"),
            Why::MemberRemoved { member, cluster } => write!(f, "the volume holds the data of member {member:x}, which cluster {cluster:x} no longer lists (it was removed): its data is set aside and this pod joins anew"),
            Why::UnreadableWalButListed => write!(f, "the WAL's identity could not be read, but the cluster lists this pod's peer URL: etcd starts and checks its own WAL"),
            Why::UnreadableWalNotListed => write!(f, "the WAL's identity could not be read and the cluster has no member at this pod's peer URL: its data is set aside and this pod joins"),
            Why::NoMemberForThisPod { cluster } => write!(f, "the volume is empty and cluster {cluster:x} has no member for this pod: join as a learner"),
            Why::NeverStartedLearner { member } => write!(f, "the cluster lists this pod as learner {member:x} that never started (an earlier attempt was interrupted): start as that learner"),
            Why::NeverStartedFormationMember { member } => write!(f, "the cluster lists this pod as member {member:x} of its formation that never started, and this volume holds that formation's marker: start as that member"),
            Why::StaleEntry { member, learner } => write!(f, "the volume is empty but the cluster still lists this pod as {} {member:x}: its log is gone, so that entry is removed and this pod joins as a new learner (never with the old member ID)", if *learner { "learner" } else { "voter" }),
            Why::BeyondInitialSize { ordinal, replicas, not_reached } => write!(f, "ordinal {ordinal} is beyond the initial cluster size {replicas}: this pod only joins a running cluster, and none answered{not_reached}"),
            Why::AgreedEarlier { token } => write!(f, "this pod already agreed to form cluster token {token} and never started etcd: start as that member"),
            Why::PeerStartedOurFormation { peer, token } => write!(f, "{peer} already started the formation this pod prepared for (token {token}): start as its member"),
            Why::PeersHoldData { holders } => write!(f, "peers hold data of a cluster this pod did not form with: {}; this volume is empty, so it waits for that cluster to regain quorum and then joins it. If a majority of the volumes is lost for good, `etcd-steward recover` shows how the cluster is recovered from the freshest surviving volume", holders.join(", ")),
            Why::NoProofYet { blockers, not_reached } => write!(f, "no proof yet that no cluster exists: {}{not_reached}", blockers.join("; ")),
            Why::ReadyToPrepare { snapshot } => write!(f, "every initial peer answered with an empty volume and no cluster answered: prepare to form a new cluster{}", from_backup(snapshot)),
            Why::BackupStoreUnreachable { error } => write!(f, "every volume is empty and no cluster answered, but the backup store cannot be listed ({error}): no proof that there is no backup to restore, so no empty cluster is formed; waiting for the store"),
            Why::NoUsableBackup { skipped } => write!(f, "every volume is empty and no cluster answered; the backup store holds snapshots but none is usable ({}): an empty cluster is not formed in their place. Fix the store or the keys, or name a snapshot with --restore, or start empty with --restore never", skipped.iter().map(|(name, why)| format!("{name} {why}")).collect::<Vec<_>>().join("; ")),
            Why::NamedBackupUnusable { name, problem } => write!(f, "every volume is empty and no cluster answered; --restore names snapshot {name}, which {problem}: waiting"),
            Why::OtherSnapshot { peer, theirs, ours } => write!(f, "{peer} prepared to form the new cluster from {}, this pod from {}: waiting until every pod chose the same", snapshot_name(theirs), snapshot_name(ours)),
            Why::OtherInitialCluster { peer, theirs, ours } => write!(f, "{peer} prepares a different initial cluster ({theirs}) than this pod ({ours}): every pod needs the same --replicas, --service and ports"),
            Why::WaitingForPrepare { pods } => write!(f, "forming a new cluster: waiting for {} to prepare", pods.join(", ")),
            Why::FormNew { token, snapshot } => write!(f, "every initial pod is empty and prepared, and no cluster exists: form a new cluster with token {token}{}", from_backup(snapshot)),
            Why::RecoveryRequested { id, plan } => write!(f, "recovery {id} was requested and this pod's own observations agree: {plan}; etcd starts once with --force-new-cluster, as a one-member cluster on this volume's data"),
            Why::RecoveryNotApplied { id, commit } => write!(f, "recovery {id}: this volume's commit index has not moved past {commit}, the index the forced start begins from, so the forced start did not happen yet (etcd was stopped before it committed): etcd starts with --force-new-cluster again; no other member can have joined meanwhile"),
            Why::RecoveryChoseOther { id, survivor } => write!(f, "recovery {id} names this pod as the survivor, but by this pod's own observations {survivor} holds the freshest volume: not acting; run etcd-steward recover again"),
            Why::RecoveryRefused { id, refusal } => write!(f, "recovery {id} was requested, but this pod's own observations refuse it: {refusal}"),
            Why::RestoreRequested { id, snapshot } => write!(f, "restore {id}: an operator restores the whole cluster to snapshot {snapshot}; this volume's data is set aside (renamed, not deleted), then every pod re-forms the cluster from the snapshot"),
            Why::PeerUrlChanged { member, listed, now } => write!(f, "the cluster lists this pod's member {member:x} at {}, but its peer URL is now {now}: the member entry is updated (MemberUpdate), keeping its ID and data, then etcd restarts", listed.join(", ")),
            Why::RestoreWhileAClusterAnswers { id, cluster } => write!(f, "restore {id}: this volume is empty, but cluster {cluster:x} answers and does not wait for this pod as a member it never started: it is the cluster being replaced (its members set their data aside first), or this pod's member of it started before and its volume was lost since (that member ID is never reused). Waiting: this pod forms the new cluster once no cluster answers, or, after the request expires, joins the one that does"),
            Why::RestoreNotSeen { id, snapshot, problem, then } => write!(f, "restore {id} to snapshot {snapshot} was requested, but this pod cannot see that snapshot usable ({problem}): its data stays (decided: {}, {})", then.action.name(), then.why),
            Why::LeftAndRemoved { member } => write!(f, "this pod left the cluster (etcd-steward leave) and member {member:x} is removed: its data is set aside (renamed, not deleted)"),
            Why::LeaveNotDone { member, listed } => write!(f, "this pod is leaving the cluster (etcd-steward leave), but {}: its data is kept; run etcd-steward leave --yes again", if *listed { format!("the cluster still lists member {member:x}") } else { "no cluster answered to confirm the member is removed".to_string() }),
            Why::Left => write!(f, "this pod left the cluster (etcd-steward leave): it does not rejoin until etcd-steward rejoin is run in it, or its volume is replaced"),
            Why::MarkerUnreadable { markers } => write!(f, "{} cannot be read, so whether this pod left the cluster or was already set aside for a restore is unknown: nothing is done on this volume until the file is repaired or moved away (the data is kept)", markers.join("; ")),
            Why::OwnNameNotPublished { host, then } => write!(f, "this pod's own DNS name ({host}) is not published yet; etcd refuses to start until it resolves (decided: {}, {})", then.action.name(), then.why),
            Why::OwnNameFails { host, error, then } => write!(f, "this pod's own DNS name ({host}) cannot be resolved: {error} (decided: {}, {})", then.action.name(), then.why),
            Why::VersionHeld { hold, then } => write!(f, "{hold} (decided: {}, {})", then.action.name(), then.why),
        }
    }
}

/// Why a snapshot in the store is not restored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unusable {
    /// etcd's checksum did not match while it streamed into the store.
    NotVerified,
    DrillFailed,
    NotInStore,
    /// This pod downloaded these very bytes (same manifest checksum, same stored object)
    /// and they failed a checksum.
    BadBytes {
        detail: String,
    },
    /// This pod tried it with the same keys as configured now, and none opens it.
    NoKey {
        encrypted_to: String,
        configured: Vec<String>,
    },
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::NotVerified => write!(f, "failed its checksum when it was taken"),
            Unusable::DrillFailed => write!(f, "failed its restore drill"),
            Unusable::NotInStore => write!(f, "is not in the store"),
            Unusable::BadBytes { detail } => write!(f, "failed its checksum when this pod downloaded it ({detail}); it is tried again once its stored object or manifest changes"),
            Unusable::NoKey { encrypted_to, configured } => write!(f, "is encrypted to key {encrypted_to}, and the keys configured now ({}) do not open it: give that key with --backup-decryption-key-file; it is tried again once the configured keys change", fingerprints(configured)),
        }
    }
}

fn fingerprints(keys: &[String]) -> String {
    if keys.is_empty() {
        "none".into()
    } else {
        keys.join(", ")
    }
}

/// Whether what this pod remembers about snapshot `s` still holds: the same content for
/// bytes that failed, the same content and the same configured keys for a key that did
/// not open it. An entry an older etcd-steward wrote (no content, no keys recorded) holds
/// nothing: the snapshot is tried once more, and if it fails again, the new entry records
/// what it failed on.
fn rejection_holds(r: &Rejection, s: &SnapshotFacts, keys: &[String]) -> Option<Unusable> {
    match &r.failed {
        Failed::Checksum { content, detail } => {
            (*content == s.content).then(|| Unusable::BadBytes {
                detail: detail.clone(),
            })
        }
        Failed::Key {
            content,
            encrypted_to,
            configured,
        } => (*content == s.content && same_set(configured, keys)).then(|| Unusable::NoKey {
            encrypted_to: encrypted_to.clone(),
            configured: keys.to_vec(),
        }),
        Failed::Unrecorded { .. } => None,
    }
}

fn same_set(a: &[String], b: &[String]) -> bool {
    let set = |v: &[String]| v.iter().cloned().collect::<std::collections::BTreeSet<_>>();
    set(a) == set(b)
}

fn from_backup(snapshot: &Option<String>) -> String {
    match snapshot {
        Some(name) => format!(", restored from backup {name}"),
        None => String::new(),
    }
}

fn snapshot_name(snapshot: &Option<String>) -> String {
    match snapshot {
        Some(name) => format!("snapshot {name}"),
        None => "nothing (empty)".into(),
    }
}

/// One round's outcome: what to do, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    pub why: Why,
}

impl Decision {
    /// The sentence an operator reads.
    pub fn reason(&self) -> String {
        self.why.to_string()
    }
}

fn decision(action: Action, why: Why) -> Decision {
    Decision { action, why }
}

fn wait(why: Why) -> Decision {
    decision(Action::Wait, why)
}

/// The formation token: every initial pod's nonce, in ordinal order. Each pod can check
/// its own nonce is in it, i.e. that it took part in forming that cluster.
pub fn formation_token(nonces: &[&str]) -> String {
    nonces.join(".")
}

fn token_includes(token: &str, ordinal: u32, nonce: &str) -> bool {
    token.split('.').nth(ordinal as usize) == Some(nonce)
}

/// Decides how this member must start.
pub fn decide(f: &Facts) -> Decision {
    if !f.data.unreadable_markers.is_empty() {
        return wait(Why::MarkerUnreadable {
            markers: f.data.unreadable_markers.clone(),
        });
    }
    if let Some(l) = &f.data.left {
        return after_leave(f, l.member_id);
    }
    let restoring = f.restore_request.as_ref();
    let d = match restoring {
        // Restoring the live cluster to a snapshot: data not yet set aside for this
        // request goes aside, but only once this pod's own look at the store shows the
        // snapshot usable (no proof, no action: the data stays and etcd restarts on it);
        // an empty volume takes part in the new formation only (it never joins the
        // cluster that is being replaced).
        Some(r) if f.data.has_data() && f.data.restored_for.as_deref() != Some(r.id.as_str()) => {
            match restore_choice(f) {
                Ok(Some(s)) if s == r.snapshot => decision(
                    Action::SetAside {
                        why: SetAsideWhy::RestoreRequested,
                    },
                    Why::RestoreRequested {
                        id: r.id.clone(),
                        snapshot: r.snapshot.clone(),
                    },
                ),
                seen => {
                    let then = decide_with_data(f);
                    decision(
                        then.action.clone(),
                        Why::RestoreNotSeen {
                            id: r.id.clone(),
                            snapshot: r.snapshot.clone(),
                            problem: match seen {
                                Err(why) => why.to_string(),
                                Ok(_) => "backups are not configured here".to_string(),
                            },
                            then: Box::new(then),
                        },
                    )
                }
            }
        }
        // An empty volume takes part in the new formation only: never while a cluster
        // answers, unless it is that formation, listing this pod as a member it has not
        // started yet (this pod prepared for it: it starts as that member).
        Some(r) if !f.data.has_data() => match &f.cluster {
            ClusterFacts::Healthy(view) if !our_formation_waits_for_us(f, view) => {
                wait(Why::RestoreWhileAClusterAnswers {
                    id: r.id.clone(),
                    cluster: view.cluster_id,
                })
            }
            _ => decide_formation(f),
        },
        _ if f.data.has_data() => decide_with_data(f),
        _ => decide_empty(f),
    };
    super::upgrade::gate(f, gate_on_own_dns(f, d))
}

/// Whether the cluster that answers is a formation this pod prepared for (it holds a
/// formation marker) that lists this pod as a member never started.
fn our_formation_waits_for_us(f: &Facts, view: &ClusterView) -> bool {
    f.data.formation.is_some()
        && view.members.iter().any(|m| {
            (m.peer_urls.contains(&f.peer_url) || (!m.name.is_empty() && m.name == f.name))
                && m.never_started()
        })
}

/// A pod that left: its data goes aside once the cluster confirms its member is removed;
/// then it waits for `rejoin`.
fn after_leave(f: &Facts, member: u64) -> Decision {
    if !f.data.has_data() {
        return wait(Why::Left);
    }
    match &f.cluster {
        ClusterFacts::Healthy(view) if !view.members.iter().any(|m| m.id == member) => decision(
            Action::SetAside {
                why: SetAsideWhy::Left,
            },
            Why::LeftAndRemoved { member },
        ),
        ClusterFacts::Healthy(_) => wait(Why::LeaveNotDone {
            member,
            listed: true,
        }),
        ClusterFacts::NotReached { .. } => wait(Why::LeaveNotDone {
            member,
            listed: false,
        }),
    }
}

/// etcd refuses to start when its advertised peer URL does not resolve, and a member
/// added before then would sit unstarted: wait for our own name first.
fn gate_on_own_dns(f: &Facts, d: Decision) -> Decision {
    let needs_dns = !matches!(
        &d.action,
        Action::Wait | Action::SetAside { .. } | Action::Bootstrap(Bootstrap::Prepare { .. })
    );
    let host = f.host.clone();
    match (&f.own_dns, needs_dns) {
        (Lookup::Found(_), _) | (_, false) => d,
        (Lookup::NotFound, true) => wait(Why::OwnNameNotPublished {
            host,
            then: Box::new(d),
        }),
        (Lookup::Failed(e), true) => wait(Why::OwnNameFails {
            host,
            error: e.clone(),
            then: Box::new(d),
        }),
    }
}

fn decide_with_data(f: &Facts) -> Decision {
    let ClusterFacts::Healthy(view) = &f.cluster else {
        if let Some(d) = recovery(f) {
            return d;
        }
        if let Some(d) = outnumbered_by_another_cluster(f) {
            return d;
        }
        return decision(Action::Restart, Why::DataAndNoClusterAnswered);
    };
    let listed_by_url = view
        .members
        .iter()
        .any(|m| m.peer_urls.contains(&f.peer_url));
    match f.data.wal_identity() {
        Some(wal) if wal.cluster_id != view.cluster_id => decision(
            Action::SetAside {
                why: SetAsideWhy::ForeignCluster,
            },
            Why::ForeignCluster {
                wal_cluster: wal.cluster_id,
                cluster: view.cluster_id,
            },
        ),
        Some(wal) => match view.members.iter().find(|m| m.id == wal.member_id) {
            Some(m) if !m.peer_urls.contains(&f.peer_url) => decision(
                Action::UpdatePeerUrls {
                    member: m.id,
                    via: view.source.clone(),
                },
                Why::PeerUrlChanged {
                    member: m.id,
                    listed: m.peer_urls.clone(),
                    now: f.peer_url.clone(),
                },
            ),
            Some(_) => decision(
                Action::Restart,
                Why::OwnMemberListed {
                    member: wal.member_id,
                },
            ),
            None => decision(
                Action::SetAside {
                    why: SetAsideWhy::RemovedMember,
                },
                Why::MemberRemoved {
                    member: wal.member_id,
                    cluster: view.cluster_id,
                },
            ),
        },
        None if listed_by_url => decision(Action::Restart, Why::UnreadableWalButListed),
        None => decision(
            Action::SetAside {
                why: SetAsideWhy::NotAMember,
            },
            Why::UnreadableWalNotListed,
        ),
    }
}

/// With data and no cluster answering: a recovery this volume is the survivor of. Either
/// its marker says the forced start has not happened yet (the commit index has not moved),
/// or an operator's request names this pod and its own plan agrees. Without a readable
/// WAL tail nothing is forced: no evidence, no action.
fn recovery(f: &Facts) -> Option<Decision> {
    let tail = f.data.tail?;
    if let Some(m) = &f.data.recovery {
        if !m.applied(Some(&tail)) {
            return Some(decision(
                Action::Recover {
                    id: m.id.clone(),
                    commit: m.commit,
                    first: false,
                },
                Why::RecoveryNotApplied {
                    id: m.id.clone(),
                    commit: m.commit,
                },
            ));
        }
    }
    let request = f
        .recovery_request
        .as_ref()
        .filter(|r| r.survivor == f.name)?;
    if f.data.recovery.as_ref().is_some_and(|m| m.id == request.id) {
        return None;
    }
    let id = request.id.clone();
    Some(
        match crate::recover::plan::plan(f, &request.force_lost, Some(&id)) {
            Ok(p) if p.survivor == f.name => decision(
                Action::Recover {
                    id: id.clone(),
                    commit: tail.commit,
                    first: true,
                },
                Why::RecoveryRequested { id, plan: p.why },
            ),
            Ok(p) => wait(Why::RecoveryChoseOther {
                id,
                survivor: p.survivor,
            }),
            Err(refusal) => wait(Why::RecoveryRefused {
                id,
                refusal: refusal.to_string(),
            }),
        },
    )
}

fn not_reached(f: &Facts) -> NotReached {
    match &f.cluster {
        ClusterFacts::NotReached { tried } => NotReached(tried.clone()),
        ClusterFacts::Healthy(_) => NotReached::default(),
    }
}

/// With data and no live cluster to ask: whether the peers' volumes show that this one is
/// the odd one out, i.e. more pods hold another cluster's WAL than hold this one's. Started,
/// such a volume (a restored backup, a PVC from elsewhere) would run as a cluster of its own
/// beside the real one; so it waits until that cluster answers, then is set aside and joins.
/// Fewer or as many holders of another cluster (a tie, or one stray volume elsewhere) do not
/// hold a member with data back: persistence over availability.
fn outnumbered_by_another_cluster(f: &Facts) -> Option<Decision> {
    let own = f.data.wal_identity()?.cluster_id;
    let mut holders: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for p in &f.peers {
        if let Some(Ok(PeerReport {
            wal: Some(w), name, ..
        })) = &p.report
        {
            holders.entry(w.cluster_id).or_default().push(name.clone());
        }
    }
    let ours = 1 + holders.get(&own).map_or(0, Vec::len);
    let (other, names) = holders
        .iter()
        .filter(|(c, _)| **c != own)
        .max_by_key(|(_, names)| names.len())?;
    (names.len() > ours).then(|| {
        wait(Why::OutnumberedByAnotherCluster {
            own,
            other: *other,
            holders: names.clone(),
            not_reached: not_reached(f),
        })
    })
}

fn decide_empty(f: &Facts) -> Decision {
    let ClusterFacts::Healthy(view) = &f.cluster else {
        return decide_formation(f);
    };
    let via = view.source.clone();
    let mine = view
        .members
        .iter()
        .find(|m| m.peer_urls.contains(&f.peer_url) || (!m.name.is_empty() && m.name == f.name));
    match mine {
        None => decision(
            Action::Join { via },
            Why::NoMemberForThisPod {
                cluster: view.cluster_id,
            },
        ),
        Some(m) if m.never_started() && m.is_learner => decision(
            Action::Resume {
                member_id: m.id,
                members: view.members.clone(),
            },
            Why::NeverStartedLearner { member: m.id },
        ),
        Some(m) if m.never_started() && f.data.formation.is_some() => decision(
            Action::Resume {
                member_id: m.id,
                members: view.members.clone(),
            },
            Why::NeverStartedFormationMember { member: m.id },
        ),
        Some(m) => decision(
            Action::Replace {
                stale: m.clone(),
                via,
            },
            Why::StaleEntry {
                member: m.id,
                learner: m.is_learner,
            },
        ),
    }
}

/// An empty volume and no live cluster: form one only with proof that none exists.
fn decide_formation(f: &Facts) -> Decision {
    if f.ordinal >= f.replicas {
        return wait(Why::BeyondInitialSize {
            ordinal: f.ordinal,
            replicas: f.replicas,
            not_reached: not_reached(f),
        });
    }
    let own = f.data.formation.as_ref();
    if let Some(Formation {
        token: Some(token),
        nonce,
        initial_cluster,
        snapshot,
    }) = own
    {
        return decision(
            Action::Bootstrap(Bootstrap::Start {
                nonce: nonce.clone(),
                initial_cluster: initial_cluster.clone(),
                token: token.clone(),
                snapshot: snapshot.clone(),
            }),
            Why::AgreedEarlier {
                token: token.clone(),
            },
        );
    }
    let mut blockers = Vec::new();
    let mut holders = Vec::new();
    for p in &f.peers {
        let initial = p.ordinal < f.replicas;
        match (&p.dns, &p.report) {
            (Lookup::NotFound, _) if initial => {
                blockers.push(format!("{}: DNS name not published yet", p.name))
            }
            (Lookup::NotFound, _) => {}
            (Lookup::Failed(e), _) => blockers.push(format!("{}: DNS lookup failed: {e}", p.name)),
            (Lookup::Found(_), None) => blockers.push(format!("{}: not asked", p.name)),
            (Lookup::Found(_), Some(Err(e))) => {
                blockers.push(format!("{}: sidecar did not answer: {e}", p.name))
            }
            (Lookup::Found(_), Some(Ok(r))) if r.has_data => holders.push(r),
            (Lookup::Found(_), Some(Ok(_))) => {}
        }
    }
    if !holders.is_empty() {
        return joined_formation_or_wait(f, own, &holders);
    }
    if !blockers.is_empty() {
        return wait(Why::NoProofYet {
            blockers,
            not_reached: not_reached(f),
        });
    }
    let snapshot = match restore_choice(f) {
        Ok(snapshot) => snapshot,
        Err(why) => return wait(why),
    };
    let own = own.filter(|o| o.initial_cluster == f.initial_cluster && o.snapshot == snapshot);
    let Some(own) = own else {
        // No marker, or one prepared for another initial cluster (the configuration changed
        // before anyone started etcd) or another snapshot (the store changed, or this pod
        // found it corrupt): prepare afresh.
        return decision(
            Action::Bootstrap(Bootstrap::Prepare {
                marker: Formation {
                    nonce: f.fresh_nonce.clone(),
                    initial_cluster: f.initial_cluster.clone(),
                    token: None,
                    snapshot: snapshot.clone(),
                },
            }),
            Why::ReadyToPrepare { snapshot },
        );
    };
    let mut nonces = Vec::new();
    let mut unprepared = Vec::new();
    for o in 0..f.replicas {
        if o == f.ordinal {
            nonces.push(own.nonce.as_str());
            continue;
        }
        let report = f
            .peers
            .iter()
            .find(|p| p.ordinal == o)
            .and_then(|p| p.report.as_ref())
            .and_then(|r| r.as_ref().ok());
        match report.and_then(|r| Some((r, r.formation.as_ref()?))) {
            Some((r, pf)) if pf.initial_cluster != own.initial_cluster => {
                return wait(Why::OtherInitialCluster {
                    peer: r.name.clone(),
                    theirs: pf.initial_cluster.clone(),
                    ours: own.initial_cluster.clone(),
                });
            }
            Some((r, pf)) if pf.snapshot != own.snapshot => {
                return wait(Why::OtherSnapshot {
                    peer: r.name.clone(),
                    theirs: pf.snapshot.clone(),
                    ours: own.snapshot.clone(),
                });
            }
            Some((_, pf)) => nonces.push(pf.nonce.as_str()),
            None => unprepared.push(f.pod_name(o)),
        }
    }
    if !unprepared.is_empty() {
        return wait(Why::WaitingForPrepare { pods: unprepared });
    }
    let token = formation_token(&nonces);
    decision(
        Action::Bootstrap(Bootstrap::Start {
            nonce: own.nonce.clone(),
            initial_cluster: own.initial_cluster.clone(),
            token: token.clone(),
            snapshot: own.snapshot.clone(),
        }),
        Why::FormNew {
            token,
            snapshot: own.snapshot.clone(),
        },
    )
}

/// Which backup a new cluster starts from: `Ok(None)` to start empty (no backups
/// configured, or the store holds none), `Ok(Some(name))` to restore that snapshot, or a
/// reason to wait (the store unreachable, or snapshots there but none usable: never an
/// empty cluster in their place).
fn restore_choice(f: &Facts) -> Result<Option<String>, Why> {
    snapshot_choice(&f.backups, &f.data.rejected_snapshots)
}

/// [`restore_choice`] from what the store holds and what this volume rejected: also how a
/// sidecar checks an operator's restore request before it stops anything.
pub fn snapshot_choice(
    backups: &BackupFacts,
    rejected: &[Rejection],
) -> Result<Option<String>, Why> {
    let problem = |s: &SnapshotFacts, keys: &[String]| {
        if !s.verified {
            Some(Unusable::NotVerified)
        } else if s.drill_failed {
            Some(Unusable::DrillFailed)
        } else {
            rejected
                .iter()
                .filter(|r| r.name == s.name)
                .find_map(|r| rejection_holds(r, s, keys))
        }
    };
    match backups {
        BackupFacts::Off => Ok(None),
        BackupFacts::NotAsked => Err(Why::BackupStoreUnreachable {
            error: "not asked yet".into(),
        }),
        BackupFacts::Unreachable { error } => Err(Why::BackupStoreUnreachable {
            error: error.clone(),
        }),
        BackupFacts::Listed {
            wanted: RestoreWanted::Latest,
            snapshots,
            keys,
        } => {
            if snapshots.is_empty() {
                return Ok(None);
            }
            if let Some(usable) = snapshots.iter().find(|s| problem(s, keys).is_none()) {
                return Ok(Some(usable.name.clone()));
            }
            Err(Why::NoUsableBackup {
                skipped: snapshots
                    .iter()
                    .filter_map(|s| Some((s.name.clone(), problem(s, keys)?)))
                    .collect(),
            })
        }
        BackupFacts::Listed {
            wanted: RestoreWanted::Named(name),
            snapshots,
            keys,
        } => match snapshots.iter().find(|s| &s.name == name) {
            None => Err(Why::NamedBackupUnusable {
                name: name.clone(),
                problem: Unusable::NotInStore,
            }),
            Some(s) => match problem(s, keys) {
                Some(p) => Err(Why::NamedBackupUnusable {
                    name: name.clone(),
                    problem: p,
                }),
                None => Ok(Some(name.clone())),
            },
        },
    }
}

/// Peers already hold data while this volume is empty and no cluster answers. Only a pod
/// that took part in that formation (its nonce is in every holder's token) may start with
/// it; anyone else waits for the data's cluster.
fn joined_formation_or_wait(
    f: &Facts,
    own: Option<&Formation>,
    holders: &[&PeerReport],
) -> Decision {
    if let Some(mine) = own {
        let tokens: Option<Vec<&str>> = holders
            .iter()
            .map(|r| match &r.formation {
                Some(Formation {
                    token: Some(t),
                    initial_cluster,
                    ..
                }) if initial_cluster == &mine.initial_cluster
                    && token_includes(t, f.ordinal, &mine.nonce) =>
                {
                    Some(t.as_str())
                }
                _ => None,
            })
            .collect();
        if let (Some(tokens), Some(first)) = (tokens, holders.first()) {
            if let Some(token) = tokens.first() {
                return decision(
                    Action::Bootstrap(Bootstrap::Start {
                        nonce: mine.nonce.clone(),
                        initial_cluster: mine.initial_cluster.clone(),
                        token: token.to_string(),
                        snapshot: mine.snapshot.clone(),
                    }),
                    Why::PeerStartedOurFormation {
                        peer: first.name.clone(),
                        token: token.to_string(),
                    },
                );
            }
        }
    }
    let names = holders
        .iter()
        .map(|r| match r.wal {
            Some(w) => format!(
                "{} (member {:x} of cluster {:x})",
                r.name, w.member_id, w.cluster_id
            ),
            None => format!("{} (WAL unreadable)", r.name),
        })
        .collect();
    wait(Why::PeersHoldData { holders: names })
}
