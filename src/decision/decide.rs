//! The pure heart of `init`: observed [`Facts`] in, one [`Decision`] out. No I/O, no
//! clock, no randomness (a fresh nonce is one of the facts); it reads `crate::facts`, the
//! decision's types, the upgrade gate and the recovery plan alone. Every rule that keeps
//! data safe is here, where a table of scenarios can prove it.
//!
//! A decision carries everything its action needs (the member to ask, the token to start
//! with), and a typed reason, [`Why`], that renders the sentence operators read.

use std::collections::BTreeMap;

use crate::facts::{ClusterFacts, ClusterView, Facts, Formation, Lookup, PeerReport};

use super::point::snapshot_choice;
use super::types::{Action, Bootstrap, Decision, NotReached, SetAsideWhy, Why};
use super::upgrade;

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
    upgrade::gate(f, gate_on_own_dns(f, d))
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
        // A member being rebuilt because its data diverged does not start on that data
        // again while no cluster answers (a leader election after its own etcd stopped):
        // it waits to hear the cluster, or for the request to expire.
        if let Some(r) = f.rebuild_request.as_ref().filter(|r| {
            f.data
                .wal_identity()
                .is_some_and(|w| w.member_id == r.member)
        }) {
            return wait(Why::RebuildWaitsForCluster { member: r.member });
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
            Some(_) => match diverged(f, view, wal.member_id) {
                Some(proof) => decision(
                    Action::SetAside {
                        why: SetAsideWhy::Diverged,
                    },
                    Why::MemberDiverged {
                        member: wal.member_id,
                        proof,
                    },
                ),
                None => decision(
                    Action::Restart,
                    Why::OwnMemberListed {
                        member: wal.member_id,
                    },
                ),
            },
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

/// The proof, in words, that member `member` (this volume's, listed by a healthy cluster)
/// diverged from the majority: a rebuild request this pod's own sidecar holds for it, whose
/// proof stands against the voters the cluster lists now (see [`crate::facts::rebuild`]).
/// Nothing else ever sets aside the data of a member the cluster still lists.
fn diverged(f: &Facts, view: &ClusterView, member: u64) -> Option<String> {
    let request = f.rebuild_request.as_ref().filter(|r| r.member == member)?;
    let voters: Vec<u64> = view
        .members
        .iter()
        .filter(|m| !m.is_learner)
        .map(|m| m.id)
        .collect();
    crate::facts::rebuild::proves(request, &voters)
        .ok()
        .map(|d| {
            format!(
                "at revision {} a strict majority of {} voters answered HashKV {:08x}; the check by {:x} ended at unix {}",
                d.revision,
                d.voters.len(),
                d.majority_hash,
                request.check.checker,
                request.check.at
            )
        })
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
        match crate::recovery::plan(f, &request.force_lost, Some(&id)) {
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
                snapshot: snapshot.clone(),
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
                        snapshot: mine.snapshot.clone(),
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
