//! The pure heart of `init`: observed [`Facts`] in, one [`Decision`] out. No I/O, no
//! clock, no randomness (a fresh nonce is one of the facts). Every rule that keeps data
//! safe is here, where a table of scenarios can prove it.

use serde::Serialize;

use crate::cluster::MemberInfo;
use crate::datadir::DataDirState;
use crate::dns::Lookup;
use crate::report::{Formation, PeerReport};

/// Everything `init` observed in one round.
#[derive(Debug, Clone)]
pub struct Facts {
    pub ordinal: u32,
    pub name: String,
    pub peer_url: String,
    pub replicas: u32,
    /// `--initial-cluster` for the configured initial size.
    pub initial_cluster: String,
    pub data: DataDirState,
    pub own_dns: Lookup,
    pub cluster: ClusterFacts,
    /// The other pods of the set that were asked (initial peers, and higher ordinals
    /// whose names exist).
    pub peers: Vec<PeerFacts>,
    /// A random nonce, used if this round prepares a formation marker.
    pub fresh_nonce: String,
}

#[derive(Debug, Clone)]
pub enum ClusterFacts {
    /// A voter that sees a leader answered and a linearizable read through it succeeded,
    /// so its member list is current.
    Healthy(ClusterView),
    /// No member could give a current view; why, per endpoint tried.
    NotReached { tried: Vec<String> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// The DNS name and address of the member that answered (membership changes go there).
    pub source: String,
    pub source_ip: std::net::IpAddr,
    pub cluster_id: u64,
    pub leader: u64,
    pub members: Vec<MemberInfo>,
}

#[derive(Debug, Clone)]
pub struct PeerFacts {
    pub ordinal: u32,
    pub name: String,
    pub dns: Lookup,
    /// The sidecar's report; `None` when it was not asked (name not resolved).
    pub report: Option<Result<PeerReport, String>>,
}

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
}

impl SetAsideWhy {
    pub fn slug(self) -> &'static str {
        match self {
            SetAsideWhy::ForeignCluster => "foreign-cluster",
            SetAsideWhy::RemovedMember => "removed-member",
            SetAsideWhy::NotAMember => "not-a-member",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BootstrapStep {
    /// Write this pod's formation marker (its nonce) so peers can see it is ready.
    Prepare,
    /// Every initial pod is prepared: record the token and start etcd as a new cluster.
    Start,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start etcd on this member's own data; touch no membership.
    Restart,
    /// Form a new cluster (in steps).
    Bootstrap {
        step: BootstrapStep,
        formation: Formation,
    },
    /// Add this pod as a learner, then start it against the cluster.
    Join,
    /// Start as the existing, never-started member entry `member_id`.
    Resume { member_id: u64 },
    /// Remove the member entry left by this pod's lost volume, then join.
    Replace { stale: MemberInfo },
    /// Rename the data aside inside the volume, then join.
    SetAside { why: SetAsideWhy },
    /// Not enough evidence: wait and look again.
    Wait,
}

impl Action {
    /// The name users see in logs and in `init --dry-run`.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Restart => "restart",
            Action::Bootstrap { .. } => "bootstrap",
            Action::Join => "join",
            Action::Resume { .. } => "resume",
            Action::Replace { .. } => "replace",
            Action::SetAside { .. } => "set-aside",
            Action::Wait => "wait",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    /// One sentence an operator understands: why this action, or what we wait for.
    pub reason: String,
}

fn decision(action: Action, reason: impl Into<String>) -> Decision {
    Decision {
        action,
        reason: reason.into(),
    }
}

fn wait(reason: impl Into<String>) -> Decision {
    decision(Action::Wait, reason)
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
    let d = if f.data.has_data() {
        decide_with_data(f)
    } else {
        decide_empty(f)
    };
    gate_on_own_dns(f, d)
}

/// etcd refuses to start when its advertised peer URL does not resolve, and a member
/// added before then would sit unstarted: wait for our own name first.
fn gate_on_own_dns(f: &Facts, d: Decision) -> Decision {
    let needs_dns = match &d.action {
        Action::Wait | Action::SetAside { .. } => false,
        Action::Bootstrap { step, .. } => *step == BootstrapStep::Start,
        _ => true,
    };
    let host = crate::identity::split_url(&f.peer_url)
        .map(|(h, _)| h)
        .unwrap_or_else(|| f.peer_url.clone());
    match (&f.own_dns, needs_dns) {
        (Lookup::Found(_), _) | (_, false) => d,
        (Lookup::NotFound, true) => wait(format!(
            "this pod's own DNS name ({host}) is not published yet; etcd refuses to start until it resolves (decided: {}, {})",
            d.action.name(),
            d.reason
        )),
        (Lookup::Failed(e), true) => wait(format!(
            "this pod's own DNS name ({host}) cannot be resolved: {e} (decided: {}, {})",
            d.action.name(),
            d.reason
        )),
    }
}

fn decide_with_data(f: &Facts) -> Decision {
    let ClusterFacts::Healthy(view) = &f.cluster else {
        if let Some(d) = outnumbered_by_another_cluster(f) {
            return d;
        }
        return decision(
            Action::Restart,
            "the volume holds member data and no live cluster answered: etcd starts on its data and waits for its peers",
        );
    };
    let listed_by_url = view
        .members
        .iter()
        .any(|m| m.peer_urls.contains(&f.peer_url));
    match f.data.wal_identity() {
        Some(wal) if wal.cluster_id != view.cluster_id => decision(
            Action::SetAside { why: SetAsideWhy::ForeignCluster },
            format!(
                "the WAL belongs to cluster {:x}, but the running cluster is {:x}: its data is set aside and this pod joins",
                wal.cluster_id, view.cluster_id
            ),
        ),
        Some(wal) if view.members.iter().any(|m| m.id == wal.member_id) => decision(
            Action::Restart,
            format!("the volume holds the data of member {:x}, which the cluster lists", wal.member_id),
        ),
        Some(wal) => decision(
            Action::SetAside { why: SetAsideWhy::RemovedMember },
            format!(
                "the volume holds the data of member {:x}, which cluster {:x} no longer lists (it was removed): its data is set aside and this pod joins anew",
                wal.member_id, view.cluster_id
            ),
        ),
        None if listed_by_url => decision(
            Action::Restart,
            "the WAL's identity could not be read, but the cluster lists this pod's peer URL: etcd starts and checks its own WAL",
        ),
        None => decision(
            Action::SetAside { why: SetAsideWhy::NotAMember },
            "the WAL's identity could not be read and the cluster has no member at this pod's peer URL: its data is set aside and this pod joins",
        ),
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
    let mut holders: std::collections::BTreeMap<u64, Vec<&str>> = Default::default();
    for p in &f.peers {
        if let Some(Ok(PeerReport {
            wal: Some(w), name, ..
        })) = &p.report
        {
            holders.entry(w.cluster_id).or_default().push(name);
        }
    }
    let ours = 1 + holders.get(&own).map_or(0, Vec::len);
    let (other, names) = holders
        .iter()
        .filter(|(c, _)| **c != own)
        .max_by_key(|(_, names)| names.len())?;
    (names.len() > ours).then(|| {
        wait(format!(
            "this volume holds data of cluster {own:x}, but {} hold data of cluster {other:x}: this data is not started as a cluster of its own; waiting for cluster {other:x} to answer, then it is set aside and this pod joins{}",
            names.join(", "),
            not_reached(f)
        ))
    })
}

/// A member that has never started has published no client URLs (its name, by contrast,
/// is set from `--initial-cluster` for the members a cluster was formed with). etcd's own
/// `isMemberBootstrapped` uses the same test.
pub fn never_started(m: &MemberInfo) -> bool {
    m.client_urls.is_empty()
}

fn decide_empty(f: &Facts) -> Decision {
    let ClusterFacts::Healthy(view) = &f.cluster else {
        return decide_formation(f);
    };
    let mine = view
        .members
        .iter()
        .find(|m| m.peer_urls.contains(&f.peer_url) || (!m.name.is_empty() && m.name == f.name));
    match mine {
        None => decision(
            Action::Join,
            format!("the volume is empty and cluster {:x} has no member for this pod: join as a learner", view.cluster_id),
        ),
        Some(m) if never_started(m) && m.is_learner => decision(
            Action::Resume { member_id: m.id },
            format!("the cluster lists this pod as learner {:x} that never started (an earlier attempt was interrupted): start as that learner", m.id),
        ),
        Some(m) if never_started(m) && f.data.formation.is_some() => decision(
            Action::Resume { member_id: m.id },
            format!("the cluster lists this pod as member {:x} of its formation that never started, and this volume holds that formation's marker: start as that member", m.id),
        ),
        Some(m) => decision(
            Action::Replace { stale: m.clone() },
            format!(
                "the volume is empty but the cluster still lists this pod as {} {:x}: its log is gone, so that entry is removed and this pod joins as a new learner (never with the old member ID)",
                if m.is_learner { "learner" } else { "voter" },
                m.id
            ),
        ),
    }
}

fn not_reached(f: &Facts) -> String {
    match &f.cluster {
        ClusterFacts::NotReached { tried } if !tried.is_empty() => {
            format!(" (no live cluster: {})", tried.join("; "))
        }
        _ => String::new(),
    }
}

/// An empty volume and no live cluster: form one only with proof that none exists.
fn decide_formation(f: &Facts) -> Decision {
    if f.ordinal >= f.replicas {
        return wait(format!(
            "ordinal {} is beyond the initial cluster size {}: this pod only joins a running cluster, and none answered{}",
            f.ordinal,
            f.replicas,
            not_reached(f)
        ));
    }
    let own = f.data.formation.as_ref();
    if let Some(
        own @ Formation {
            token: Some(token), ..
        },
    ) = own
    {
        return decision(
            Action::Bootstrap { step: BootstrapStep::Start, formation: own.clone() },
            format!("this pod already agreed to form cluster token {token} and never started etcd: start as that member"),
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
        // A peer already started etcd. Only a pod that took part in that formation (its
        // nonce is in the peer's token) may start with it; anyone else waits for the data.
        let ours = |r: &&PeerReport| {
            matches!((own, &r.formation), (Some(mine), Some(Formation { token: Some(t), initial_cluster, .. }))
                if initial_cluster == &mine.initial_cluster && token_includes(t, f.ordinal, &mine.nonce))
        };
        if let (Some(mine), Some(first)) = (own, holders.first()) {
            if holders.iter().all(ours) {
                let token = first
                    .formation
                    .as_ref()
                    .and_then(|x| x.token.clone())
                    .unwrap_or_default();
                let mut formation = mine.clone();
                formation.token = Some(token.clone());
                return decision(
                    Action::Bootstrap { step: BootstrapStep::Start, formation },
                    format!("{} already started the formation this pod prepared for (token {token}): start as its member", first.name),
                );
            }
        }
        let names: Vec<String> = holders
            .iter()
            .map(|r| match r.wal {
                Some(w) => format!(
                    "{} (member {:x} of cluster {:x})",
                    r.name, w.member_id, w.cluster_id
                ),
                None => format!("{} (WAL unreadable)", r.name),
            })
            .collect();
        return wait(format!(
            "peers hold data of a cluster this pod did not form with: {}; this volume is empty, so it waits for that cluster to regain quorum and then joins it. If a majority of the volumes is lost for good, an operator must restore that cluster from a surviving member or a snapshot",
            names.join(", ")
        ));
    }
    if !blockers.is_empty() {
        return wait(format!(
            "no proof yet that no cluster exists: {}{}",
            blockers.join("; "),
            not_reached(f)
        ));
    }
    let own = own.filter(|o| o.initial_cluster == f.initial_cluster);
    let Some(own) = own else {
        // No marker, or one prepared for another initial cluster (the configuration changed
        // before anyone started etcd): prepare afresh for the configured one.
        return decision(
            Action::Bootstrap {
                step: BootstrapStep::Prepare,
                formation: Formation { nonce: f.fresh_nonce.clone(), initial_cluster: f.initial_cluster.clone(), token: None },
            },
            "every initial peer answered with an empty volume and no cluster answered: prepare to form a new cluster",
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
        match report.and_then(|r| r.formation.as_ref()) {
            Some(pf) if pf.initial_cluster != own.initial_cluster => {
                return wait(format!(
                    "{} prepares a different initial cluster ({}) than this pod ({}): every pod needs the same --replicas, --service and ports",
                    report.map(|r| r.name.as_str()).unwrap_or_default(),
                    pf.initial_cluster,
                    own.initial_cluster
                ));
            }
            Some(pf) => nonces.push(pf.nonce.as_str()),
            None => unprepared.push(format!(
                "{}-{o}",
                f.name.rsplit_once('-').map(|x| x.0).unwrap_or_default()
            )),
        }
    }
    if !unprepared.is_empty() {
        return wait(format!(
            "forming a new cluster: waiting for {} to prepare",
            unprepared.join(", ")
        ));
    }
    let token = formation_token(&nonces);
    let mut formation = own.clone();
    formation.token = Some(token.clone());
    decision(
        Action::Bootstrap { step: BootstrapStep::Start, formation },
        format!("every initial pod is empty and prepared, and no cluster exists: form a new cluster with token {token}"),
    )
}
