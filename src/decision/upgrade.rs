//! Pure: whether the etcd release this pod would start may join the cluster its peers run.
//! A binary etcd would refuse (older than the cluster version, or more than one minor
//! release ahead of it), or a path etcd's own upgrade notes call unsafe, waits with a
//! reason instead of starting etcd into a crash loop.
//!
//! Only what peers said holds a start: a binary whose version could not be read, or peers
//! that did not answer, hold nothing. A member restarting on its own data must not be held
//! by silence (etcd itself still refuses an incompatible cluster once it hears from it).

use crate::facts::{ClusterFacts, EtcdVersion, Facts, VersionFacts};

use super::types::{Action, Decision, Hold, Why, SAFE_FOR_3_6};

/// Why the binary must wait, if a peer's answer says so.
pub fn hold(v: &VersionFacts) -> Option<Hold> {
    let binary = v.binary?;
    let key = |x: &EtcdVersion| (x.major, x.minor);
    // Members agree on one cluster version; a peer still catching up may report an older
    // one, so the highest reported is the cluster's. (Until the leader settles it, etcd
    // reports 3.0: never higher than the truth, so it never holds a binary wrongly.)
    let cluster = v
        .peers
        .iter()
        .filter_map(|p| p.cluster.map(|c| (c, p.name.clone())))
        .max_by_key(|(c, _)| key(c));
    if let Some((cluster, peer)) = cluster {
        if key(&binary) < key(&cluster) {
            return Some(Hold::Older {
                binary,
                cluster,
                peer,
            });
        }
    }
    // A skipped minor release shows in the oldest release a peer runs (the cluster version
    // may still be 3.0, not yet settled).
    if let Some(p) = v.peers.iter().min_by_key(|p| p.server) {
        if binary.major != p.server.major || binary.minor > p.server.minor + 1 {
            return Some(Hold::SkipsMinor {
                binary,
                server: p.server,
                peer: p.name.clone(),
            });
        }
    }
    if key(&binary) >= (3, 5) && v.auth_on_3_4 == Some(true) {
        if let Some(p) = v.peers.iter().find(|p| key(&p.server) == (3, 4)) {
            return Some(Hold::AuthOn3_4 {
                binary,
                server: p.server,
                peer: p.name.clone(),
            });
        }
    }
    if key(&binary) >= (3, 6) {
        if let Some(p) = v.peers.iter().find(|p| p.server < SAFE_FOR_3_6) {
            return Some(Hold::Before3_5Safe {
                binary,
                server: p.server,
                peer: p.name.clone(),
            });
        }
    }
    None
}

/// How old (seconds) the store's newest verified snapshot may be to count as taken before
/// the first member of a newer minor release starts.
pub const SNAPSHOT_FRESH: u64 = 60;

/// This binary's release and the cluster version, when this pod would start the first
/// member of a newer minor release: the binary is ahead of the cluster version a peer
/// reports, and no peer runs its minor release (or a newer one) yet.
pub fn first_of_new_minor(v: &VersionFacts) -> Option<(EtcdVersion, EtcdVersion)> {
    let binary = v.binary?;
    let key = |x: &EtcdVersion| (x.major, x.minor);
    let cluster = v.peers.iter().filter_map(|p| p.cluster).max_by_key(key)?;
    let first = v.peers.iter().all(|p| key(&p.server) < key(&binary));
    (key(&binary) > key(&cluster) && first).then_some((binary, cluster))
}

/// With backups, before the first member of a newer minor release starts: the store's
/// newest verified snapshot must be at most [`SNAPSHOT_FRESH`] old, or one is taken first
/// through the member that answered (`Action::Snapshot`); with no member to take it
/// through, or a store that cannot be listed, the start waits. A recovery or a new cluster
/// is not held (there is no cluster to take a snapshot of), nor a set-aside.
fn snapshot_first(f: &Facts, d: Decision) -> Decision {
    let (Some((binary, cluster)), Some(age)) = (
        first_of_new_minor(&f.versions),
        f.versions.snapshot_age.as_ref(),
    ) else {
        return d;
    };
    // What starts etcd, or changes membership for it; a set-aside is followed by a join,
    // which waits then.
    if !matches!(
        d.action,
        Action::Restart
            | Action::Join { .. }
            | Action::Resume { .. }
            | Action::Replace { .. }
            | Action::UpdatePeerUrls { .. }
    ) {
        return d;
    }
    let state = match age {
        Ok(Some(a)) if *a <= SNAPSHOT_FRESH => return d,
        Ok(Some(a)) => format!("the store's newest verified snapshot is {a}s old"),
        Ok(None) => "the store holds no verified snapshot".to_string(),
        Err(e) => format!("the store cannot be listed ({e}): waiting for it"),
    };
    let via = match (&f.cluster, age) {
        (ClusterFacts::Healthy(view), Ok(_)) => Some(view.source.clone()),
        _ => None,
    };
    let state = match (&via, age) {
        (None, Ok(_)) => {
            format!("{state}, and no live member answers to take one through: waiting")
        }
        _ => state,
    };
    Decision {
        action: via.map_or(Action::Wait, |via| Action::Snapshot { via }),
        why: Why::SnapshotBeforeUpgrade {
            binary,
            cluster,
            state,
            then: Box::new(d),
        },
    }
}

/// Holds any decision that would start etcd (or change membership or the volume for it)
/// while this binary may not join, or, with backups, until a fresh snapshot exists before
/// the first member of a newer minor release starts; a wait stays that wait.
pub fn gate(f: &Facts, d: Decision) -> Decision {
    if matches!(d.action, Action::Wait) {
        return d;
    }
    match hold(&f.versions) {
        Some(hold) => Decision {
            action: Action::Wait,
            why: Why::VersionHeld {
                hold,
                then: Box::new(d),
            },
        },
        None => snapshot_first(f, d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::PeerVersion;

    fn v(text: &str) -> EtcdVersion {
        EtcdVersion::parse(text).unwrap_or_else(|| panic!("{text}"))
    }

    fn peers(binary: &str, peers: &[(&str, Option<&str>)]) -> VersionFacts {
        VersionFacts {
            binary: Some(v(binary)),
            peers: peers
                .iter()
                .enumerate()
                .map(|(i, (server, cluster))| PeerVersion {
                    name: format!("etcd-{i}"),
                    server: v(server),
                    cluster: cluster.map(v),
                })
                .collect(),
            auth_on_3_4: None,
            snapshot_age: None,
        }
    }

    #[test]
    fn versions_parse_from_etcd_and_its_version_endpoint() {
        let out = "etcd Version: 3.5.30\nGit SHA: Not provided\nGo Version: go1.26.4\n";
        assert_eq!(
            v(out),
            EtcdVersion {
                major: 3,
                minor: 5,
                patch: 30
            }
        );
        assert_eq!(
            v("3.4.0"),
            EtcdVersion {
                major: 3,
                minor: 4,
                patch: 0
            }
        );
        assert_eq!(
            v("v3.6.0-rc.1"),
            EtcdVersion {
                major: 3,
                minor: 6,
                patch: 0
            }
        );
        assert_eq!(EtcdVersion::parse("not_decided"), None);
        assert_eq!(EtcdVersion::parse(""), None);
    }

    #[test]
    fn each_path_holds_or_passes() {
        // (binary, peers as (server, cluster version), what the hold says or None).
        type Peers<'a> = &'a [(&'a str, Option<&'a str>)];
        let table: &[(&str, Peers, Option<&str>)] = &[
            // Same release, a patch either way, a rolling upgrade one minor up.
            ("3.5.30", &[("3.5.30", Some("3.5.0"))], None),
            ("3.5.1", &[("3.5.30", Some("3.5.0"))], None),
            (
                "3.5.30",
                &[("3.4.23", Some("3.4.0")), ("3.5.30", Some("3.4.0"))],
                None,
            ),
            // Downgrade below the cluster version.
            (
                "3.4.23",
                &[("3.5.30", Some("3.5.0"))],
                Some("cannot join a cluster at version 3.5"),
            ),
            // Mid-upgrade a 3.4 binary may still return: the cluster is still at 3.4.
            (
                "3.4.23",
                &[("3.5.30", Some("3.4.0")), ("3.4.23", Some("3.4.0"))],
                None,
            ),
            // A minor release skipped.
            (
                "3.6.0",
                &[("3.4.23", Some("3.4.0"))],
                Some("one minor release at a time"),
            ),
            // 3.6 onto 3.5 before 3.5.26, whatever the cluster version says.
            (
                "3.6.1",
                &[("3.5.30", Some("3.5.0")), ("3.5.19", Some("3.5.0"))],
                Some("etcd-1 runs etcd 3.5.19"),
            ),
            ("3.6.1", &[("3.5.25", None)], Some("3.5.26 or newer")),
            (
                "3.6.1",
                &[("3.5.26", Some("3.5.0")), ("3.6.1", Some("3.5.0"))],
                None,
            ),
            // Nobody answered: nothing holds.
            ("3.4.23", &[], None),
            // A peer answers but its cluster version is not decided yet.
            ("3.4.23", &[("3.5.30", None)], None),
            // Right after a formation (or with a member down) etcd still reports 3.0.
            (
                "3.5.30",
                &[("3.5.30", Some("3.0.0")), ("3.5.30", Some("3.0.0"))],
                None,
            ),
            // Two minors ahead of a peer's release, whatever the cluster version says.
            (
                "3.6.1",
                &[("3.4.23", Some("3.0.0"))],
                Some("while etcd-0 runs etcd 3.4.23"),
            ),
        ];
        for (binary, ps, want) in table {
            let got = hold(&peers(binary, ps)).map(|h| h.to_string());
            match (want, &got) {
                (None, None) => {}
                (Some(w), Some(g)) if g.contains(w) => {}
                _ => panic!("{binary} with {ps:?}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn a_3_5_binary_beside_a_3_4_peer_with_auth_on_waits_and_unknown_auth_holds_nothing() {
        let mixed = [("3.4.23", Some("3.4.0")), ("3.5.30", Some("3.4.0"))];
        let with = |auth| VersionFacts {
            auth_on_3_4: auth,
            snapshot_age: None,
            ..peers("3.5.30", &mixed)
        };
        let held = hold(&with(Some(true))).map(|h| h.to_string());
        assert!(
            held.as_deref().is_some_and(|h| h
                .contains("etcd-0 runs etcd 3.4.23 with authentication on")
                && h.contains("etcdctl auth disable")),
            "{held:?}"
        );
        assert_eq!(
            hold(&with(Some(false))),
            None,
            "auth off: the upgrade goes on"
        );
        assert_eq!(hold(&with(None)), None, "not known: silence holds nothing");
        // Once every peer runs 3.5 the path is done, whatever auth says.
        let done = VersionFacts {
            auth_on_3_4: Some(true),
            ..peers("3.5.30", &[("3.5.30", Some("3.5.0"))])
        };
        assert_eq!(hold(&done), None);
        // A 3.4 binary returning mid-upgrade is not this path.
        let back = VersionFacts {
            auth_on_3_4: Some(true),
            ..peers("3.4.23", &mixed)
        };
        assert_eq!(hold(&back), None);
    }

    #[test]
    fn an_unreadable_binary_version_holds_nothing() {
        let mut f = peers("3.4.23", &[("3.5.30", Some("3.5.0"))]);
        f.binary = None;
        assert_eq!(hold(&f), None);
    }
}
