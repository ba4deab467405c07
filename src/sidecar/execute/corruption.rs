//! The corruption check's I/O (issue 27): the leader's sidecar asks every voter's status
//! (its revision), then every voter's `HashKV` at the lowest of those revisions, in a task
//! of its own (a large database takes seconds to hash; the loop never waits), and judges
//! the answers (`facts::hashes::judge`, pure). Every other sidecar reads the leader's
//! verdict from its peer report (at most every few seconds), so a member the check found
//! diverged is taken out of readiness by its own sidecar; the verdict about this member is
//! held until a newer check says it agrees (a new leader that has not checked yet clears
//! nothing). What each sidecar knows is in its own peer report, for `status`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, BoxFuture};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::dns::Dns;
use crate::etcd::{Connector, Etcd, MemberInfo};
use crate::facts::hashes::{
    common_revision, judge, Answered, HashAnswer, HashCheck, HashRound, Standing, Verdict,
};
use crate::facts::PeerReport;
use crate::identity::Identity;
use crate::observe::{HttpReports, PeerReports};
use crate::sidecar::conn::{connect_url, Connections};
use crate::sidecar::http::metrics::OptionalSeconds;
use crate::sidecar::plan::{Observation, Step};

/// A voter's status is answered from memory: longer than this, it counts as silent.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a follower gives the leader's sidecar to answer its report.
const REPORT_TIMEOUT: Duration = Duration::from_secs(1);
/// A follower reads the leader's verdict this often at most (or every check interval,
/// when shorter).
const READ_EVERY: Duration = Duration::from_secs(5);
/// The longest error kept per answer (the report has a size cap).
const ERROR_CHARS: usize = 160;

/// Asks every voter for its hash at one common revision (see [`ask_hashes`]).
pub type AskHashes = Arc<dyn Fn(Vec<MemberInfo>) -> BoxFuture<'static, HashRound> + Send + Sync>;

/// The asker over `dns` and `connector`.
pub fn asker<D, C>(dns: D, connector: C) -> AskHashes
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
{
    Arc::new(move |voters| {
        let (dns, connector) = (dns.clone(), connector.clone());
        Box::pin(async move { ask_hashes(&dns, &connector, &voters).await })
    })
}

fn short(e: impl ToString) -> String {
    e.to_string().chars().take(ERROR_CHARS).collect()
}

/// Every voter's status, then its `HashKV` at the lowest revision they reported (each has
/// applied it). A voter that cannot be reached, or does not answer, is silent.
pub async fn ask_hashes<D: Dns, C: Connector>(
    dns: &D,
    connector: &C,
    voters: &[MemberInfo],
) -> HashRound {
    let members: Vec<Result<C::Member, String>> = join_all(voters.iter().map(|v| async move {
        connect_url(dns, connector, v.client_urls.first().map(String::as_str))
            .await
            .map_err(short)
    }))
    .await;
    let revisions = join_all(members.iter().map(|m| async move {
        let m = m.as_ref().ok()?;
        match tokio::time::timeout(STATUS_TIMEOUT, m.status()).await {
            Ok(Ok(s)) => Some(s.revision),
            _ => None,
        }
    }))
    .await;
    let revision = common_revision(&revisions.iter().flatten().copied().collect::<Vec<_>>());
    let answers = join_all(voters.iter().zip(&members).map(|(v, m)| async move {
        let got = match (m, revision) {
            (Err(e), _) => Answered::NoAnswer { error: e.clone() },
            (Ok(_), None) => Answered::NoAnswer {
                error: "no voter reported its revision".into(),
            },
            (Ok(m), Some(rev)) => match m.hash_kv(rev).await {
                Ok((hash, compact_revision)) => Answered::Hash {
                    hash,
                    compact_revision,
                },
                Err(e) => Answered::NoAnswer { error: short(&e) },
            },
        };
        HashAnswer { member: v.id, got }
    }))
    .await;
    HashRound {
        revision: revision.unwrap_or_default(),
        voters: voters.iter().map(|v| v.id).collect(),
        answers,
    }
}

/// Reads the leader's verdict from its sidecar's peer report.
pub struct LeaderReader {
    reports: HttpReports,
    identity: Identity,
    every: Duration,
    last: Option<Instant>,
    pending: Option<JoinHandle<Result<PeerReport, String>>>,
}

impl LeaderReader {
    /// Reading through `reports` (the peer-report client), at most every `interval` or
    /// five seconds, whichever is shorter.
    pub fn new(reports: HttpReports, identity: Identity, interval: Duration) -> Self {
        LeaderReader {
            reports,
            identity,
            every: interval.min(READ_EVERY),
            last: None,
            pending: None,
        }
    }
}

impl LeaderReader {
    /// The leader's pod (name, DNS name) when a read is due: this member is a follower that
    /// sees a leader, and the last read is `every` old.
    fn due(&self, seen: &Observation) -> Option<(String, String)> {
        let status = seen.local.status.as_ref().ok()?;
        if status.leader == 0 || status.leader == status.member_id {
            return None;
        }
        if self
            .last
            .is_some_and(|t| seen.now.duration_since(t) < self.every)
        {
            return None;
        }
        let leader = seen
            .members
            .as_deref()?
            .iter()
            .find(|m| m.id == status.leader)?;
        let ordinal = self.identity.ordinal_of_peer_urls(&leader.peer_urls)?;
        Some((self.identity.pod_name(ordinal), self.identity.host(ordinal)))
    }
}

/// Starts corruption checks, collects their verdicts and what the leader's say, and
/// exports them.
pub struct HashChecks {
    ask: AskHashes,
    ended_tx: mpsc::UnboundedSender<HashCheck>,
    ended_rx: mpsc::UnboundedReceiver<HashCheck>,
    metrics: CorruptionExport,
    /// The newest check this sidecar knows, whoever ran it (its peer report carries it).
    known: watch::Sender<Option<HashCheck>>,
    /// The newest check that judged this member (agreed or diverged).
    about_me: Option<HashCheck>,
    /// The `at` of the check the per-member metric shows.
    shown: Option<u64>,
    /// Reads the leader's verdict (set up by `sidecar::run`; none in tests with fakes).
    pub reader: Option<LeaderReader>,
    /// Where a verdict that this member diverged is posted (a `MemberDiverged` Event on
    /// this pod, once per check that says so).
    pub events: crate::kube_api::events::Events,
}

impl HashChecks {
    /// Registers the corruption metrics in `registry`.
    pub fn new(ask: AskHashes, registry: &mut Registry) -> Self {
        let (ended_tx, ended_rx) = mpsc::unbounded_channel();
        HashChecks {
            ask,
            ended_tx,
            ended_rx,
            metrics: CorruptionExport::register(registry),
            known: watch::channel(None).0,
            about_me: None,
            shown: None,
            reader: None,
            events: crate::kube_api::events::Events::off(),
        }
    }

    /// The newest check this sidecar knows, as it publishes it (for the peer report).
    pub fn known(&self) -> watch::Receiver<Option<HashCheck>> {
        self.known.subscribe()
    }

    /// Starts one check of `voters` in its own task, as member `checker`.
    pub fn start(&self, voters: Vec<MemberInfo>, checker: u64) {
        let ask = self.ask.clone();
        let tx = self.ended_tx.clone();
        tokio::spawn(async move {
            let round = ask(voters).await;
            let check = HashCheck {
                at: crate::clock::unix_now(),
                checker,
                verdict: judge(&round),
                answers: round.answers,
            };
            // The loop may have stopped (SIGTERM): nobody is left to tell.
            let _ = tx.send(check);
        });
    }

    /// Adds to the observation the checks of this sidecar that ended, and takes in them
    /// and the leader's verdict (read from its report when due).
    pub async fn gather<D: Dns, C: Connector>(
        &mut self,
        conn: &mut Connections<D, C>,
        seen: &mut Observation,
    ) {
        let me = seen.local.status.as_ref().map_or(0, |s| s.member_id);
        let mut ended = Vec::new();
        while let Ok(check) = self.ended_rx.try_recv() {
            log(&check);
            self.metrics.count(&check);
            ended.push(check);
        }
        for check in &ended {
            self.absorb(check, me);
        }
        seen.hash_checks = ended;
        if let Some(check) = self.read_leader(conn, seen).await {
            self.absorb(&check, me);
        }
    }

    /// The leader's newest check, when a read of its report ended since the last tick;
    /// starts the next read when one is due (this member a follower that sees a leader).
    async fn read_leader<D: Dns, C: Connector>(
        &mut self,
        conn: &mut Connections<D, C>,
        seen: &Observation,
    ) -> Option<HashCheck> {
        let reader = self.reader.as_mut()?;
        let mut got = None;
        if reader.pending.as_ref().is_some_and(JoinHandle::is_finished) {
            if let Some(task) = reader.pending.take() {
                match task.await {
                    Ok(Ok(report)) => got = report.hash_check,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "the leader's report (for its corruption check) was not read")
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "reading the leader's report ended abnormally")
                    }
                }
            }
        }
        if reader.pending.is_none() {
            if let Some((name, host)) = reader.due(seen) {
                reader.last = Some(seen.now);
                if let Some(ip) = conn.resolve(&host).await {
                    let reports = reader.reports.clone();
                    reader.pending = Some(tokio::spawn(async move {
                        reports.report(&name, &host, ip, REPORT_TIMEOUT).await
                    }));
                }
            }
        }
        got
    }

    /// Takes in a check (this sidecar's or the leader's): the newest one known, the
    /// per-member metric from the newest that judged, and what it says about member `me`.
    fn absorb(&mut self, check: &HashCheck, me: u64) {
        let newer = |held: Option<&HashCheck>| held.is_none_or(|h| check.at >= h.at);
        if newer(self.known.borrow().as_ref()) {
            self.known.send_replace(Some(check.clone()));
        }
        let judged = check.verdict.judged();
        if !judged.is_empty() && self.shown.is_none_or(|at| check.at >= at) {
            self.shown = Some(check.at);
            self.metrics.diverged.clear();
            for (member, diverged) in judged {
                let label = MemberLabel {
                    member: format!("{member:x}"),
                };
                self.metrics
                    .diverged
                    .get_or_create(&label)
                    .set(i64::from(diverged));
            }
        }
        if me != 0
            && check.verdict.standing(me) != Standing::Unknown
            && newer(self.about_me.as_ref())
        {
            let seen_before = self.about_me.as_ref().is_some_and(|h| h.at == check.at);
            if let (Standing::Diverged { hash, majority }, false) =
                (check.verdict.standing(me), seen_before)
            {
                self.events.post(
                    crate::kube_api::events::Reason::MemberDiverged,
                    format!("member {me:x}'s data diverged: its HashKV is {hash:08x}, the majority's {majority:08x} ({}); it is out of readiness and must be rebuilt from its peers", check.verdict),
                );
            }
            self.about_me = Some(check.clone());
        }
    }

    /// The newest check that judged member `me`, for its readiness.
    pub fn about(&self, me: u64) -> Option<&HashCheck> {
        self.about_me
            .as_ref()
            .filter(|c| c.verdict.standing(me) != Standing::Unknown)
    }
}

/// Runs [`Step::CheckHashes`]: starts the check when this sidecar has the job.
pub fn start(jobs: Option<&HashChecks>, step: &Step) -> Result<(), String> {
    match (jobs, step) {
        (Some(j), Step::CheckHashes { voters, checker }) => {
            j.start(voters.clone(), *checker);
            Ok(())
        }
        (None, _) => Err("the corruption check is off (--corruption-check-interval=0)".into()),
        (_, other) => Err(format!("not a corruption check: {other:?}")),
    }
}

fn log(check: &HashCheck) {
    let checker = format!("{:x}", check.checker);
    match &check.verdict {
        Verdict::Agreed { .. } => {
            tracing::info!(%checker, verdict = %check.verdict, "corruption check: every voter that answered has the majority's data")
        }
        Verdict::Diverged(d) => {
            let diverged: Vec<String> = d.members().map(|m| format!("{m:x}")).collect();
            tracing::error!(%checker, revision = d.revision, majority_hash = %format!("{:08x}", d.majority_hash), diverged = ?diverged, verdict = %check.verdict, "corruption check: a member's data diverged from the majority's; it is out of readiness (its sidecar reads this verdict) and must be rebuilt from its peers");
        }
        Verdict::Undecided { .. } => {
            tracing::warn!(%checker, verdict = %check.verdict, answers = ?check.answers, "corruption check proved nothing: no member is judged diverged");
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberLabel {
    member: String,
}

/// The corruption metrics (names are a contract: the alert and docs/reference.md read them).
#[derive(Debug, Clone, Default)]
pub struct CorruptionExport {
    checks: Family<OutcomeLabel, Counter>,
    last_success: OptionalSeconds,
    diverged: Family<MemberLabel, Gauge>,
}

impl CorruptionExport {
    /// Registers every corruption metric in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = CorruptionExport::default();
        registry.register(
            "etcd_steward_corruption_checks",
            "Corruption checks this sidecar ran as leader, by outcome: agreed, diverged, split (answers disagree with no majority), undecided (too few answers, a compaction under way)",
            m.checks.clone(),
        );
        registry.register(
            "etcd_steward_corruption_check_last_success_timestamp_seconds",
            "When this sidecar's last corruption check that reached a verdict (agreed or diverged) ended, Unix seconds",
            m.last_success.clone(),
        );
        registry.register(
            "etcd_steward_member_diverged",
            "1 for a member the newest corruption check this sidecar knows found diverged from the majority's hash, 0 for one that agreed",
            m.diverged.clone(),
        );
        m
    }

    fn count(&self, check: &HashCheck) {
        let outcome = check.verdict.label();
        self.checks.get_or_create(&OutcomeLabel { outcome }).inc();
        if matches!(outcome, "agreed" | "diverged") {
            #[allow(clippy::cast_precision_loss)]
            self.last_success.set(check.at as f64);
        }
    }
}
