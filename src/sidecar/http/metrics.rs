//! Metrics through `prometheus-client`: registered once at start, updated by the loop,
//! encoded on each scrape as OpenMetrics text. Each feature registers its own families
//! (the planners in their constructors; the health verdicts and the init journal here), so a
//! new one touches no other.
//!
//! A scraper that asks only for the Prometheus text format (`Accept: text/plain`, as
//! `promtool check metrics` reads) gets it: the same samples, with a counter's `# HELP` and
//! `# TYPE` named like its samples (`…_total`), which OpenMetrics names without the suffix.

use std::collections::BTreeMap;
use std::fmt::{self, Write};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::facts::ActionKind;
use crate::sidecar::health::{Health, Role};
use crate::tls::CertExpiry;

/// The exposition formats `/metrics` serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    /// Prometheus text 0.0.4, for clients that do not accept OpenMetrics.
    PrometheusText,
}

impl Format {
    /// OpenMetrics unless the `Accept` header asks for plain text and not OpenMetrics.
    pub fn negotiate(accept: &str) -> Format {
        let accept = accept.to_ascii_lowercase();
        if !accept.contains("application/openmetrics-text") && accept.contains("text/plain") {
            Format::PrometheusText
        } else {
            Format::OpenMetrics
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::PrometheusText => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// Encodes every registered metric in `format`.
pub fn encode(registry: &Registry, format: Format) -> Result<String, fmt::Error> {
    let mut openmetrics = String::new();
    prometheus_client::encoding::text::encode(&mut openmetrics, registry)?;
    Ok(match format {
        Format::OpenMetrics => openmetrics,
        Format::PrometheusText => prometheus_text(&openmetrics),
    })
}

/// OpenMetrics text → Prometheus text 0.0.4: a counter family `x` (samples `x_total`) is
/// declared as `x_total`; `# UNIT` and `# EOF` are not part of that format.
fn prometheus_text(openmetrics: &str) -> String {
    let counters: Vec<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let declared = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(&name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        let _ = writeln!(out, "{}", declared.as_deref().unwrap_or(line));
    }
    out
}

/// A gauge that is absent (no sample, no family) while its value is unknown.
#[derive(Debug, Clone)]
pub struct OptionalGauge {
    value: Arc<AtomicI64>,
}

impl Default for OptionalGauge {
    fn default() -> Self {
        OptionalGauge {
            value: Arc::new(AtomicI64::new(i64::MIN)),
        }
    }
}

impl OptionalGauge {
    pub fn set(&self, value: Option<u64>) {
        let v = value.map_or(i64::MIN, |v| i64::try_from(v).unwrap_or(i64::MAX));
        self.value.store(v, Ordering::Relaxed);
    }

    pub fn get(&self) -> Option<i64> {
        Some(self.value.load(Ordering::Relaxed)).filter(|v| *v != i64::MIN)
    }
}

impl EncodeMetric for OptionalGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        match self.get() {
            Some(v) => encoder.encode_gauge(&v),
            None => Ok(()),
        }
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }

    fn is_empty(&self) -> bool {
        self.get().is_none()
    }
}

/// A floating-point gauge (seconds, a Unix time) that is absent while its value is unknown.
#[derive(Debug, Clone)]
pub struct OptionalSeconds {
    bits: Arc<AtomicU64>,
}

impl Default for OptionalSeconds {
    fn default() -> Self {
        OptionalSeconds {
            bits: Arc::new(AtomicU64::new(f64::NAN.to_bits())),
        }
    }
}

impl OptionalSeconds {
    pub fn set(&self, value: f64) {
        self.bits.store(value.to_bits(), Ordering::Relaxed);
    }

    pub fn get(&self) -> Option<f64> {
        Some(f64::from_bits(self.bits.load(Ordering::Relaxed))).filter(|v| !v.is_nan())
    }
}

impl EncodeMetric for OptionalSeconds {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        match self.get() {
            Some(v) => encoder.encode_gauge(&v),
            None => Ok(()),
        }
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }

    fn is_empty(&self) -> bool {
        self.get().is_none()
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabel {
    role: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabel {
    action: String,
}

/// The health verdicts, as gauges.
#[derive(Debug)]
pub struct HealthMetrics {
    role: Family<RoleLabel, Gauge>,
    leader_present: Gauge,
    ready: Gauge,
    live: Gauge,
    etcd_running: Gauge,
    raft_index_lag: OptionalGauge,
}

impl HealthMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = HealthMetrics {
            role: Family::default(),
            leader_present: Gauge::default(),
            ready: Gauge::default(),
            live: Gauge::default(),
            etcd_running: Gauge::default(),
            raft_index_lag: OptionalGauge::default(),
        };
        registry.register(
            "etcd_steward_member_role",
            "1 for the local member's current role (learner or voter)",
            m.role.clone(),
        );
        registry.register(
            "etcd_steward_leader_present",
            "1 if the local member sees a leader",
            m.leader_present.clone(),
        );
        registry.register(
            "etcd_steward_ready",
            "1 if the member passes the readiness checks",
            m.ready.clone(),
        );
        registry.register(
            "etcd_steward_live",
            "1 if the member passes the liveness check",
            m.live.clone(),
        );
        registry.register(
            "etcd_steward_etcd_running",
            "1 if the local etcd answers on its client or peer API; 0 while init is still deciding or etcd is down",
            m.etcd_running.clone(),
        );
        registry.register(
            "etcd_steward_raft_index_lag",
            "How many raft entries the local member is behind the leader",
            m.raft_index_lag.clone(),
        );
        m.set(&Health::starting());
        m
    }

    pub fn set(&self, h: &Health) {
        for (role, is) in [("learner", Role::Learner), ("voter", Role::Voter)] {
            self.role
                .get_or_create(&RoleLabel { role })
                .set(i64::from(h.role == is));
        }
        self.leader_present.set(i64::from(h.leader_present));
        self.ready.set(i64::from(h.ready.ok));
        self.live.set(i64::from(h.live.ok));
        self.etcd_running.set(i64::from(h.etcd_running));
        self.raft_index_lag.set(h.raft_index_lag);
    }
}

/// The data volume as the sidecar sees it (read-only): its size and free space, and the bytes
/// of the copies set aside on it, which only an operator removes
/// (`etcd-steward set-aside --remove`).
#[derive(Debug)]
pub struct VolumeMetrics {
    capacity: Gauge,
    available: Gauge,
    set_aside: Gauge,
    set_aside_copies: Gauge,
    /// When the set-aside copies were last sized (a walk of their files: once a minute).
    sized_at: Option<std::time::Instant>,
}

impl VolumeMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = VolumeMetrics {
            capacity: Gauge::default(),
            available: Gauge::default(),
            set_aside: Gauge::default(),
            set_aside_copies: Gauge::default(),
            sized_at: None,
        };
        registry.register(
            "etcd_steward_volume_capacity_bytes",
            "Size of the file system holding the data directory (0 until read)",
            m.capacity.clone(),
        );
        registry.register(
            "etcd_steward_volume_available_bytes",
            "Bytes of the data directory's file system available to etcd",
            m.available.clone(),
        );
        registry.register(
            "etcd_steward_set_aside_bytes",
            "Bytes of the copies set aside on the data volume (set-aside/): kept until an operator removes one with etcd-steward set-aside --remove",
            m.set_aside.clone(),
        );
        registry.register(
            "etcd_steward_set_aside_copies",
            "Copies set aside on the data volume (set-aside/)",
            m.set_aside_copies.clone(),
        );
        m
    }

    /// Reads the file system under `data_dir` (a `statvfs`, every call) and sizes the
    /// set-aside copies (at most once a minute). What cannot be read keeps its last value.
    pub fn update(&mut self, data_dir: &std::path::Path) {
        if let Ok(st) = rustix::fs::statvfs(data_dir) {
            let frsize = st.f_frsize.max(1);
            let to_i64 =
                |blocks: u64| i64::try_from(blocks.saturating_mul(frsize)).unwrap_or(i64::MAX);
            self.capacity.set(to_i64(st.f_blocks));
            self.available.set(to_i64(st.f_bavail));
        }
        let due = self
            .sized_at
            .is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(60));
        if due {
            self.sized_at = Some(std::time::Instant::now());
            if let Ok(copies) = crate::volume::aside::list(data_dir) {
                let bytes: u64 = copies.iter().map(|c| c.bytes).sum();
                self.set_aside.set(i64::try_from(bytes).unwrap_or(i64::MAX));
                self.set_aside_copies
                    .set(i64::try_from(copies.len()).unwrap_or(i64::MAX));
            }
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FileLabel {
    file: String,
}

/// When the certificates in use expire, by configured file (certificate and CA files of the
/// client and peer TLS), as last (re)loaded.
#[derive(Debug)]
pub struct CertificateMetrics {
    expiry: Family<FileLabel, Gauge>,
    refused: Counter,
}

impl CertificateMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let expiry = Family::default();
        registry.register(
            "etcd_steward_certificate_expiry_timestamp_seconds",
            "When the first certificate of each configured TLS file (a certificate file's leaf, a CA file's first CA) in use expires: its notAfter, Unix seconds",
            expiry.clone(),
        );
        let refused = Counter::default();
        registry.register(
            "etcd_steward_certificate_reloads_refused",
            "Changed TLS files that loaded but were not used: an expired certificate, or one no CA of its CA file issued (the last good set stays in use)",
            refused.clone(),
        );
        CertificateMetrics { expiry, refused }
    }

    /// Brings the counter to `total`, the refusals every TLS material counted since start.
    pub fn set_refused(&self, total: u64) {
        let had = self.refused.get();
        if total > had {
            self.refused.inc_by(total - had);
        }
    }

    pub fn set(&self, expiry: &[CertExpiry]) {
        for e in expiry {
            let label = FileLabel {
                file: e.file.display().to_string(),
            };
            self.expiry.get_or_create(&label).set(e.not_after);
        }
    }
}

/// The decisions `init` recorded in its journal on this volume, by action.
#[derive(Debug)]
pub struct InitMetrics {
    decisions: Family<ActionLabel, Counter>,
    recoveries: Counter,
}

impl InitMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let decisions = Family::default();
        registry.register(
            "etcd_steward_init_decisions",
            "Decisions etcd-steward init acted on for this volume, by action",
            decisions.clone(),
        );
        let recoveries = Counter::default();
        registry.register(
            "etcd_steward_recoveries",
            "Recoveries from this volume as the freshest survivor (etcd started once with --force-new-cluster)",
            recoveries.clone(),
        );
        InitMetrics {
            decisions,
            recoveries,
        }
    }

    /// Brings the counters to the journal's counts. The journal only grows; should it
    /// shrink (a volume set aside and replaced), the counter starts over, as a restart would.
    pub fn set(&self, counts: &BTreeMap<ActionKind, u64>) {
        // init journals a recovery once, when it first writes the volume's marker.
        let recovered = counts.get(&ActionKind::Recover).copied().unwrap_or(0);
        let had = self.recoveries.get();
        if recovered > had {
            self.recoveries.inc_by(recovered - had);
        }
        for (action, n) in counts {
            let label = ActionLabel {
                action: action.name().to_string(),
            };
            let had = self.decisions.get_or_create(&label).get();
            if *n < had {
                self.decisions.remove(&label);
            }
            let had = self.decisions.get_or_create(&label).get();
            self.decisions.get_or_create(&label).inc_by(n - had);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::unwrap_used)]
    fn the_volume_metrics_read_the_file_system_and_the_set_aside_copies() {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("set-aside/100-left/member/wal");
        std::fs::create_dir_all(&wal).unwrap();
        std::fs::write(wal.join("0.wal"), vec![0u8; 4096]).unwrap();
        let mut registry = Registry::default();
        let mut m = VolumeMetrics::register(&mut registry);
        m.update(dir.path());
        let text = encode(&registry, Format::PrometheusText).unwrap();
        let value = |name: &str| -> i64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("{name} not in {text}"))
        };
        let (capacity, available) = (
            value("etcd_steward_volume_capacity_bytes"),
            value("etcd_steward_volume_available_bytes"),
        );
        assert!(
            capacity > 0 && (0..=capacity).contains(&available),
            "{text}"
        );
        assert_eq!(value("etcd_steward_set_aside_bytes"), 4096);
        assert_eq!(value("etcd_steward_set_aside_copies"), 1);
    }

    #[test]
    fn plain_text_is_chosen_only_when_openmetrics_is_not_accepted() {
        assert_eq!(Format::negotiate(""), Format::OpenMetrics);
        assert_eq!(Format::negotiate("*/*"), Format::OpenMetrics);
        assert_eq!(
            Format::negotiate(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            ),
            Format::OpenMetrics
        );
        assert_eq!(Format::negotiate("text/plain"), Format::PrometheusText);
    }

    #[test]
    fn the_text_format_declares_counters_by_their_sample_name() -> Result<(), fmt::Error> {
        let mut registry = Registry::default();
        let c = Counter::<u64>::default();
        registry.register("x_things", "Things", c.clone());
        c.inc();
        let text = encode(&registry, Format::PrometheusText)?;
        assert_eq!(
            text,
            "# HELP x_things_total Things.\n# TYPE x_things_total counter\nx_things_total 1\n"
        );
        Ok(())
    }

    #[test]
    fn certificate_expiry_is_one_sample_per_file_and_follows_a_reload() -> Result<(), fmt::Error> {
        let mut registry = Registry::default();
        let m = CertificateMetrics::register(&mut registry);
        let at = |file: &str, not_after| CertExpiry {
            file: file.into(),
            not_after,
        };
        m.set(&[
            at("/tls/tls.crt", 1_900_000_000),
            at("/tls/ca.crt", 2_000_000_000),
        ]);
        m.set(&[
            at("/tls/tls.crt", 1_950_000_000),
            at("/tls/ca.crt", 2_000_000_000),
        ]);
        let text = encode(&registry, Format::PrometheusText)?;
        // A family's samples come out in its hash map's order: compare them sorted.
        let mut samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        samples.sort_unstable();
        assert_eq!(
            samples,
            [
                r#"etcd_steward_certificate_expiry_timestamp_seconds{file="/tls/ca.crt"} 2000000000"#,
                r#"etcd_steward_certificate_expiry_timestamp_seconds{file="/tls/tls.crt"} 1950000000"#,
                "etcd_steward_certificate_reloads_refused_total 0",
            ]
        );
        Ok(())
    }

    #[test]
    fn decision_counters_follow_the_journal_and_start_over_if_it_shrinks() {
        let mut registry = Registry::default();
        let m = InitMetrics::register(&mut registry);
        let counts = |n| BTreeMap::from([(ActionKind::Join, n)]);
        let value = |m: &InitMetrics| {
            m.decisions
                .get_or_create(&ActionLabel {
                    action: "join".into(),
                })
                .get()
        };
        m.set(&counts(2));
        assert_eq!(value(&m), 2);
        m.set(&counts(5));
        assert_eq!(value(&m), 5);
        m.set(&counts(1));
        assert_eq!(value(&m), 1);
    }
}
