//! Certificates rotate under running sidecars, as cert-manager renews them: here every
//! certificate is replaced by one from a new CA (the hardest case: etcd itself must restart to
//! trust a new CA). The sidecars read the files again as they change, serve the peer reports
//! and reconnect to etcd with the new ones, and are ready again without a restart; files
//! caught half-written (new certificates beside the old keys) are not used meanwhile.
//!
//! And the chart's default: every pod issues its own certificates from the CAs it is given
//! (`--tls-issuer-dir`), renews them before they expire with no restart of etcd or the
//! agent, and etcd and the sidecars admit as a peer only a certificate of this set's peer
//! name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use etcd_steward::http_client::get_with;
use etcd_steward::tls::issue::{common_names, subject_alt_names};
use etcd_steward::tls::{TlsFiles, TlsMaterial};
use harness::client::sample;
use harness::loopback::Set;
use harness::pki::Pki;
use harness::{wait_for_or, Etcd};

/// The agent under test.
const STEWARD: &str = env!("CARGO_BIN_EXE_etcd-steward");

const FORM: Duration = Duration::from_secs(60);
const HEAL: Duration = Duration::from_secs(90);

/// rcgen's default notAfter (4096-01-01), which the set's first certificates carry.
const FIRST_EXPIRY: f64 = 67_090_118_400.0;
/// 2040-01-01, which the renewed certificates carry.
const RENEWED_UNTIL: (i32, u8, u8) = (2040, 1, 1);
const RENEWED_EXPIRY: f64 = 2_208_988_800.0;

/// What the sidecar logs when changed files do not load together.
const NOT_LOADED: &str = "do not load together";

/// A client configuration (a snapshot: it does not follow the files) presenting `pki`'s
/// peer certificate and trusting its peer CA.
fn peer_client(pki: &Pki) -> Arc<rustls::ClientConfig> {
    TlsMaterial::load(&TlsFiles {
        cert: pki.path("peer.pem"),
        key: pki.path("peer-key.pem"),
        ca: pki.path("peer-ca.pem"),
    })
    .unwrap()
    .client_config()
}

/// The status of pod `o`'s `/peer/report` over mutual TLS with `tls`; `None` when the
/// handshake (or the connection) failed.
async fn report_status(set: &Set, o: u32, tls: &Arc<rustls::ClientConfig>) -> Option<u16> {
    let addr = SocketAddr::new(IpAddr::V4(set.pod(o).ip), 8443);
    get_with(
        addr,
        &set.host(o),
        "/peer/report",
        Duration::from_secs(3),
        1 << 16,
        Some(tls),
    )
    .await
    .ok()
    .map(|(code, _)| code)
}

/// Pod `o`'s `etcd_steward_certificate_expiry_timestamp_seconds` for `file`.
async fn expiry(set: &Set, o: u32, file: &Path) -> Option<f64> {
    let (_, text) = set.http(o, "/metrics").await?;
    let series = format!(
        "etcd_steward_certificate_expiry_timestamp_seconds{{file=\"{}\"}}",
        file.display()
    );
    sample(&text, &series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_from_a_new_ca_are_used_by_the_running_sidecars_without_a_restart() {
    let mut set = Set::new(STEWARD, Etcd::V3_5Tls, 3).await.unwrap();
    for o in 0..3 {
        set.start(o).unwrap();
    }
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    let sidecars: Vec<Option<u32>> = (0..3).map(|o| set.sidecar_pid(o)).collect();
    let pki = Pki {
        dir: set.pki.as_ref().unwrap().dir.clone(),
        issuer: false,
    };
    let next = set.renewed_pki("pki-next", RENEWED_UNTIL).unwrap();
    let (old_peer, new_peer) = (peer_client(&pki), peer_client(&next));
    let watched = [pki.path("client.pem"), pki.path("peer-ca.pem")];
    for o in 0..3 {
        for file in &watched {
            assert_eq!(expiry(&set, o, file).await, Some(FIRST_EXPIRY), "pod {o}");
        }
    }

    // Caught half-way: the new CA's certificates are there, the keys are still the old ones.
    for file in ["client.pem", "client-ca.pem", "peer.pem", "peer-ca.pem"] {
        pki.replace_from(&next, file).unwrap();
    }
    let refusals = |set: &Set, o: u32| set.read_logs(o, "sidecar").matches(NOT_LOADED).count();
    wait_for_or(
        Duration::from_secs(10),
        "every sidecar to refuse the half-written client and peer files",
        // Both sides: two lines, or one more for a side whose two files were seen apart.
        || async { (0..3).all(|o| refusals(&set, o) >= 2) },
        || set.dump(),
    )
    .await;
    let said: Vec<usize> = (0..3).map(|o| refusals(&set, o)).collect();
    // Several ticks later: still the old material, and said once per change, not per tick.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for o in 0..3 {
        assert_eq!(
            refusals(&set, o),
            said[o as usize],
            "pod {o}: said once per change of the files, not at every tick"
        );
        assert!(
            said[o as usize] <= 4,
            "pod {o}: at most once per file replaced"
        );
        assert!(
            set.ready(o).await,
            "pod {o} stays ready on its old material"
        );
        for file in &watched {
            assert_eq!(
                expiry(&set, o, file).await,
                Some(FIRST_EXPIRY),
                "pod {o}: {} not loaded half-written",
                file.display()
            );
        }
        assert_eq!(
            report_status(&set, o, &old_peer).await,
            Some(200),
            "pod {o}: its peer-report server still uses the old certificate and CA"
        );
    }

    // The keys arrive: the new material is whole and is used at once.
    for file in ["client-key.pem", "peer-key.pem"] {
        pki.replace_from(&next, file).unwrap();
    }
    wait_for_or(
        Duration::from_secs(10),
        "every sidecar to load the renewed certificates",
        || async {
            for o in 0..3 {
                for file in &watched {
                    if expiry(&set, o, file).await != Some(RENEWED_EXPIRY) {
                        return false;
                    }
                }
            }
            true
        },
        || set.dump(),
    )
    .await;
    for o in 0..3 {
        assert_eq!(
            report_status(&set, o, &new_peer).await,
            Some(200),
            "pod {o}: the peer-report server presents the new certificate and admits the new CA"
        );
        assert_eq!(
            report_status(&set, o, &old_peer).await,
            None,
            "pod {o}: a certificate of the old peer CA is no longer admitted"
        );
    }

    // etcd reads its trusted CA only at start: it restarts with the new files. Down first,
    // until every sidecar has seen it down, so that being ready again proves a connection
    // made after the restart.
    for o in 0..3 {
        set.kill_etcd(o).await;
    }
    wait_for_or(
        Duration::from_secs(15),
        "every sidecar to see its etcd down",
        || async {
            for o in 0..3 {
                if set.ready(o).await {
                    return false;
                }
            }
            true
        },
        || set.dump(),
    )
    .await;
    // init reads the new files and asks its peers' sidecars for their reports over the new
    // peer certificates.
    for o in 0..3 {
        set.start_init(o).unwrap();
    }
    set.reload_client_tls().unwrap();
    set.wait_ready(&[0, 1, 2], 3, HEAL).await.unwrap();
    for o in 0..3 {
        assert!(
            set.sidecar_running(o),
            "pod {o}: the sidecar never restarted"
        );
        assert_eq!(set.sidecar_pid(o), sidecars[o as usize], "pod {o}");
        assert!(
            set.read_logs(o, "sidecar")
                .contains("reconnecting to etcd with them"),
            "pod {o}: the sidecar reopened its etcd connection with the new files"
        );
    }
    set.put_keys("k", 5).await.unwrap();
    assert_eq!(set.count_keys_on(2, "k/").await.unwrap_or(-1), 5);
    set.shutdown().await;
}

/// A client configuration presenting `pki`'s `name.pem` and trusting its `ca`.
fn client_of(pki: &Pki, name: &str, ca: &str) -> Arc<rustls::ClientConfig> {
    TlsMaterial::load(&TlsFiles {
        cert: pki.path(&format!("{name}.pem")),
        key: pki.path(&format!("{name}-key.pem")),
        ca: pki.path(ca),
    })
    .unwrap()
    .client_config()
}

/// The leaf certificate pod `o`'s etcd serves on `port` now (a new handshake, not resumed:
/// a resumed session reports the certificate of the session it resumes), as DER.
async fn served(set: &Set, o: u32, port: u16, tls: &Arc<rustls::ClientConfig>) -> Option<Vec<u8>> {
    let mut fresh = (**tls).clone();
    fresh.resumption = rustls::client::Resumption::disabled();
    let tls = &Arc::new(fresh);
    let tcp = tokio::net::TcpStream::connect((set.pod(o).ip, port))
        .await
        .ok()?;
    let name = rustls_pki_types::ServerName::try_from(set.host(o)).ok()?;
    let conn = tokio::time::timeout(
        Duration::from_secs(3),
        tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp),
    )
    .await
    .ok()?
    .ok()?;
    let (_, session) = conn.get_ref();
    Some(session.peer_certificates()?.first()?.as_ref().to_vec())
}

/// GET `path` on pod `o`'s `port` over mutual TLS with `tls`: its status, or `None` when the
/// handshake (or the request) failed.
async fn get_status(
    set: &Set,
    o: u32,
    port: u16,
    path: &str,
    tls: &Arc<rustls::ClientConfig>,
) -> Option<u16> {
    let addr = SocketAddr::new(IpAddr::V4(set.pod(o).ip), port);
    get_with(
        addr,
        &set.host(o),
        path,
        Duration::from_secs(3),
        1 << 16,
        Some(tls),
    )
    .await
    .ok()
    .map(|(code, _)| code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_issue_their_own_certificates_and_renew_them_without_restarting_etcd_or_the_agent() {
    let mut set = Set::new(STEWARD, Etcd::V3_5Tls, 3).await.unwrap();
    set.issue_own_certificates().unwrap();
    // The shortest validity: renewed with 20 s left, 40 s after issue.
    set.extra_args.push("--tls-issued-validity=60s".into());
    for o in 0..3 {
        set.start(o).unwrap();
    }
    set.wait_ready(&[0, 1, 2], 3, FORM).await.unwrap();
    let pki = Pki {
        dir: set.pki.as_ref().unwrap().dir.clone(),
        issuer: true,
    };
    let client = client_of(&pki, "client", "client-ca.pem");
    let peer = client_of(&pki, "peer", "peer-ca.pem");
    let stranger = client_of(&pki, "stranger", "peer-ca.pem");
    let etcds: Vec<Option<u32>> = (0..3).map(|o| set.etcd_pid(o)).collect();
    let sidecars: Vec<Option<u32>> = (0..3).map(|o| set.sidecar_pid(o)).collect();
    let mut first = Vec::new();
    for o in 0..3 {
        let host = set.host(o);
        // Its client port and its peer port each present a certificate of this pod.
        let client_cert = served(&set, o, 2379, &client).await.expect("client port");
        let peer_cert = served(&set, o, 2380, &peer).await.expect("peer port");
        assert!(
            subject_alt_names(&client_cert).contains(&host),
            "{:?}",
            subject_alt_names(&client_cert)
        );
        let peer_names = subject_alt_names(&peer_cert);
        assert!(peer_names.contains(&host), "{peer_names:?}");
        for other in (0..3).filter(|p| *p != o) {
            assert!(
                !peer_names
                    .iter()
                    .any(|n| n.contains(&format!("etcd-{other}."))),
                "pod {o}'s peer certificate names pod {other}: {peer_names:?}"
            );
        }
        assert_eq!(common_names(&peer_cert), vec!["etcd-peer".to_string()]);
        // A certificate of the peer CA under another name is no peer: etcd and the sidecar
        // refuse it; the set's peer name is admitted.
        assert_eq!(
            get_status(&set, o, 2380, "/version", &peer).await,
            Some(200),
            "pod {o}"
        );
        assert_eq!(
            get_status(&set, o, 2380, "/version", &stranger).await,
            None,
            "pod {o}: etcd admitted a stranger"
        );
        assert_eq!(report_status(&set, o, &peer).await, Some(200), "pod {o}");
        assert_eq!(
            report_status(&set, o, &stranger).await,
            None,
            "pod {o}: the sidecar admitted a stranger"
        );
        first.push((client_cert, peer_cert));
    }

    // Renewed with a third of the validity left: every pod's etcd serves new certificates
    // on both ports, and nothing restarted.
    wait_for_or(
        Duration::from_secs(60),
        "every pod's etcd to serve renewed client and peer certificates",
        || async {
            for o in 0..3 {
                let (c, p) = &first[o as usize];
                if served(&set, o, 2379, &client).await.as_ref() == Some(c)
                    || served(&set, o, 2380, &peer).await.as_ref() == Some(p)
                {
                    return false;
                }
            }
            true
        },
        || set.dump(),
    )
    .await;
    for o in 0..3 {
        assert_eq!(
            set.etcd_pid(o),
            etcds[o as usize],
            "pod {o}: etcd restarted"
        );
        assert_eq!(
            set.sidecar_pid(o),
            sidecars[o as usize],
            "pod {o}: the sidecar restarted"
        );
        assert!(
            set.read_logs(o, "sidecar")
                .contains("certificates issued again"),
            "pod {o}: the sidecar says it renewed them"
        );
    }
    // Still one cluster: the peers dial one another with the new certificates, the sidecars
    // reach etcd with theirs.
    set.put_keys("renewed", 5).await.unwrap();
    for o in 0..3 {
        assert_eq!(
            set.count_keys_on(o, "renewed/").await.unwrap_or(-1),
            5,
            "pod {o}"
        );
    }
    set.wait_ready(&[0, 1, 2], 3, HEAL).await.unwrap();
    set.shutdown().await;
}
