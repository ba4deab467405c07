//! Pure: whether the etcd release this pod would start may join the cluster its peers run.
//! A binary etcd would refuse (older than the cluster version, or more than one minor
//! release ahead of it), or a path etcd's own upgrade notes call unsafe, waits with a
//! reason instead of starting etcd into a crash loop.
//!
//! Only what peers said holds a start: a binary whose version could not be read, or peers
//! that did not answer, hold nothing. A member restarting on its own data must not be held
//! by silence (etcd itself still refuses an incompatible cluster once it hears from it).

use crate::facts::{EtcdVersion, Facts, VersionFacts};

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
            return Some(Hold::Before3_5_20 {
                binary,
                server: p.server,
                peer: p.name.clone(),
            });
        }
    }
    None
}

/// Holds any decision that would start etcd (or change membership or the volume for it)
/// while this binary may not join; a wait stays that wait.
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
        None => d,
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
            // 3.6 onto 3.5 before 3.5.20, whatever the cluster version says.
            (
                "3.6.1",
                &[("3.5.30", Some("3.5.0")), ("3.5.19", Some("3.5.0"))],
                Some("etcd-1 runs etcd 3.5.19"),
            ),
            ("3.6.1", &[("3.5.19", None)], Some("3.5.20 or newer")),
            (
                "3.6.1",
                &[("3.5.20", Some("3.5.0")), ("3.6.1", Some("3.5.0"))],
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
