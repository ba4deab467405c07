//! Certificates rotate under running sidecars, as cert-manager renews them: here every
//! certificate is replaced by one from a new CA (the hardest case: etcd itself must restart to
//! trust a new CA). The sidecars read the files again as they change, serve the peer reports
//! and reconnect to etcd with the new ones, and are ready again without a restart; files
//! caught half-written (new certificates beside the old keys) are not used meanwhile.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use etcd_steward::http_client::get_with;
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
