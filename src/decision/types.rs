//! What a decision is: the [`Action`] `init` takes and the typed reason, [`Why`], whose
//! `Display` is the sentence operators read. Plain data; the logic is in `decide.rs`.

use serde::Serialize;

use crate::facts::{ActionKind, Endpoint, EtcdVersion, Formation, MemberInfo};

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
    /// Its data diverged from the majority's (the leader's corruption check proves it): it
    /// is rebuilt from its peers.
    Diverged,
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
            SetAsideWhy::Diverged => "diverged",
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
    /// Take a snapshot of the cluster through `via` into the backup store (before this pod
    /// starts the first member of a newer etcd minor release); then look again.
    Snapshot { via: Endpoint },
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
            Action::Snapshot { .. } => ActionKind::Snapshot,
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
        /// The snapshot the formation restores, if any.
        snapshot: Option<String>,
    },
    PeerStartedOurFormation {
        peer: String,
        token: String,
        /// The snapshot the formation restores, if any.
        snapshot: Option<String>,
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
    /// A rebuild of this member is held but no cluster answers: its diverged data does not
    /// start again meanwhile.
    RebuildWaitsForCluster {
        member: u64,
    },
    /// This member's data diverged from the majority's: the check that proves it, as the
    /// leader's sidecar handed it to this pod's.
    MemberDiverged {
        member: u64,
        proof: String,
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
    /// A record of the agent's own on the volume (the leave, restore, formation or
    /// recovery marker, the rejected snapshots, the decision journal) exists but cannot be
    /// read or parsed, each named with its error: what it says is unknown, so nothing is
    /// decided on the volume until someone looks.
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
        hold: Hold,
        then: Box<Decision>,
    },
    /// This pod would start the first member of a newer minor release, and with backups the
    /// store holds no fresh snapshot of the cluster yet: `state` says what it holds.
    SnapshotBeforeUpgrade {
        binary: EtcdVersion,
        cluster: EtcdVersion,
        state: String,
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
            | Why::VersionHeld { then, .. }
            | Why::SnapshotBeforeUpgrade { then, .. } => then.why.outstanding(),
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
            Why::AgreedEarlier { token, snapshot } => write!(f, "this pod already agreed to form cluster token {token} and never started etcd: start as that member{}", from_backup(snapshot)),
            Why::PeerStartedOurFormation { peer, token, snapshot } => write!(f, "{peer} already started the formation this pod prepared for (token {token}): start as its member{}", from_backup(snapshot)),
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
            Why::RebuildWaitsForCluster { member } => write!(f, "member {member:x} is to be rebuilt (its data diverged from the majority's) but no live cluster answered: it does not start on that data again; waiting to hear the cluster (or for the request to expire)"),
            Why::MemberDiverged { member, proof } => write!(f, "member {member:x}'s data diverged from the majority's ({proof}): its data is set aside (renamed, not deleted) and it joins again as a new member, rebuilt from its peers"),
            Why::LeftAndRemoved { member } => write!(f, "this pod left the cluster (etcd-steward leave) and member {member:x} is removed: its data is set aside (renamed, not deleted)"),
            Why::LeaveNotDone { member, listed } => write!(f, "this pod is leaving the cluster (etcd-steward leave), but {}: its data is kept; run etcd-steward leave --yes again", if *listed { format!("the cluster still lists member {member:x}") } else { "no cluster answered to confirm the member is removed".to_string() }),
            Why::Left => write!(f, "this pod left the cluster (etcd-steward leave): it does not rejoin until etcd-steward rejoin is run in it, or its volume is replaced"),
            Why::MarkerUnreadable { markers } => write!(f, "cannot read {}: what this volume's own records say (whether this pod left the cluster, was already set aside for a restore, took part in a formation or a recovery, which snapshots failed here, what init already did) is unknown, so nothing is done on this volume until the file is repaired or moved away (the data is kept)", markers.join("; ")),
            Why::OwnNameNotPublished { host, then } => write!(f, "this pod's own DNS name ({host}) is not published yet; etcd refuses to start until it resolves (decided: {}, {})", then.action.name(), then.why),
            Why::OwnNameFails { host, error, then } => write!(f, "this pod's own DNS name ({host}) cannot be resolved: {error} (decided: {}, {})", then.action.name(), then.why),
            Why::VersionHeld { hold, then } => write!(f, "{hold} (decided: {}, {})", then.action.name(), then.why),
            Why::SnapshotBeforeUpgrade { binary, cluster, state, then } => write!(f, "etcd {binary} would start the first member of {} while the cluster runs {}: with --backup-url a snapshot of the cluster is taken first, and {state} (decided: {}, {})", minor(binary), minor(cluster), then.action.name(), then.why),
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
    /// A moment no usable snapshot and the archive after it reach: the range they do.
    OutsideRange {
        range: String,
    },
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::NotVerified => write!(f, "failed its checksum when it was taken"),
            Unusable::DrillFailed => write!(f, "failed its restore drill"),
            Unusable::NotInStore => write!(f, "is not in the store"),
            Unusable::OutsideRange { range } => write!(f, "is outside the restorable range ({range})"),
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

/// The first 3.5 release a 3.6 member may join: earlier 3.5 releases can hold membership
/// data that etcd 3.6 does not accept — the "zombie members" a `--force-new-cluster` on 3.5.21
/// and earlier leaves in the v3 store, and the "too many learner members" error — which
/// 3.5.24 to 3.5.26 repair (etcd.io/docs/v3.6/upgrades/upgrade_3_6: "make sure that all of
/// your 3.5 members are updated to 3.5.26 or later"; etcd.io/blog/2025/zombie_members_upgrade).
pub const SAFE_FOR_3_6: EtcdVersion = EtcdVersion {
    major: 3,
    minor: 5,
    patch: 26,
};

/// Why this pod's etcd release waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// The binary is older than the cluster version: etcd never lowers it.
    Older {
        binary: EtcdVersion,
        cluster: EtcdVersion,
        peer: String,
    },
    /// The binary is more than one minor release ahead of a peer's release.
    SkipsMinor {
        binary: EtcdVersion,
        server: EtcdVersion,
        peer: String,
    },
    /// etcd 3.5 or newer beside a 3.4 peer while etcd's authentication is on.
    AuthOn3_4 {
        binary: EtcdVersion,
        server: EtcdVersion,
        peer: String,
    },
    /// etcd 3.6 or newer while a peer runs a release older than 3.5.26.
    Before3_5Safe {
        binary: EtcdVersion,
        server: EtcdVersion,
        peer: String,
    },
}

fn minor(v: &EtcdVersion) -> String {
    format!("{}.{}", v.major, v.minor)
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hold::Older { binary, cluster, peer } => write!(f, "etcd {binary} cannot join a cluster at version {} ({peer} says so): etcd never lowers a cluster's version, and would exit; start this pod with etcd {}.x (see docs/operations/upgrades.md)", minor(cluster), minor(cluster)),
            Hold::SkipsMinor { binary, server, peer } => write!(f, "etcd {binary} cannot join while {peer} runs etcd {server}: etcd upgrades one minor release at a time; upgrade every member to {}.{} first (see docs/operations/upgrades.md)", server.major, server.minor + 1),
            Hold::AuthOn3_4 { binary, server, peer } => write!(f, "etcd {binary} waits: {peer} runs etcd {server} with authentication on, and a mixed 3.4/3.5 cluster with auth on can refuse requests and diverge (etcd-io/etcd#13976); disable auth (etcdctl auth disable), upgrade every member, then enable it again (see docs/operations/upgrades.md)"),
            Hold::Before3_5Safe { binary, server, peer } => write!(f, "etcd {binary} waits: {peer} runs etcd {server}, and etcd 3.6 may only join members at {SAFE_FOR_3_6} or newer (older 3.5 releases can hold membership data 3.6 rejects); upgrade every member to the latest 3.5 first (see docs/operations/upgrades.md)"),
        }
    }
}
