//! A member whose etcd does not start on its data (issue 27), its own pod's part. etcd's
//! initial check (`init`'s default) refuses to start a member whose data differs from its
//! peers': it then serves nothing wrong, but it answers no `HashKV` either, so the leader's
//! check cannot judge it and nothing would rebuild it; the container restarts on the same
//! data for ever. Its own sidecar judges it instead, by the same rule:
//! - once this pod's etcd has not answered for [`DOWN_FOR`] and another member of the
//!   volume's cluster answers with a leader and lists this member as a voter (no learner
//!   joining: one member at a time), the volume's database file is hashed offline
//!   ([`crate::backup::offline_hash`]: copied only while no etcd holds it, restored into
//!   the scratch space, served by a throw-away etcd on loopback) at its own revision;
//! - every other voter is asked its `HashKV` at that revision from here;
//! - only when a strict majority of all voters answer one hash and the file answers
//!   another ([`crate::facts::rebuild::offline_proof`]) does this sidecar hold a rebuild
//!   request for its member, with that proof, as if the leader's sidecar had handed it.
//!   `init`, at the container's next start, checks the proof against the voters it sees
//!   and sets the data aside (`set-aside/<time>-diverged/`), as for any rebuild.
//!
//! A file that agrees with the majority (a member merely behind, or down for another
//! reason) is not judged again until it changes; silence, a compacted revision or no
//! majority proves nothing. The offline hash needs the restore tool and the scratch space,
//! which come with `--backup-url`.
//!
//! And once etcd serves here again as a voter after being silent that long (etcd's own
//! check passes once the revisions it would compare are compacted on its peers, or it was
//! off), this member's data is judged at once, online, against every voter's at one common
//! revision (`execute::corruption::ask_hashes`, as the leader's check asks), by the same
//! rule ([`crate::facts::rebuild::own_proof`]), rather than at the leader's next check an
//! interval later: on the majority's proof the request is held and the rebuild goes on as
//! when the leader's sidecar hands it over (its etcd stopped once, then `init`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backup::drill::DrillSetup;
use crate::backup::offline_hash::{db_file, fingerprint, hash_db_file, Fingerprint};
use crate::config::Config;
use crate::dns::Dns;
use crate::etcd::{Connector, Etcd, MemberInfo};
use crate::facts::hashes::{Answered, HashAnswer};
use crate::facts::rebuild::{offline_proof, own_proof, RebuildRequest};
use crate::identity::Identity;

use super::conn::{connect_url, hash_kv_at};
use super::execute::corruption::ask_hashes;
use super::recovery::{Inbox, Taken};

/// How long this pod's etcd must not have answered before its data is looked at (a start
/// takes less; a crash loop restarts it within seconds).
pub const DOWN_FOR: Duration = Duration::from_secs(10);
/// A look that proved nothing (no cluster, a copy refused) is tried again this often.
pub const RETRY: Duration = Duration::from_secs(10);
/// A file judged agreeing is judged again when it changed, or after this long.
pub const REJUDGE: Duration = crate::control::REQUEST_TTL;
/// How long a member's status may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// What one look found.
#[derive(Debug)]
pub enum Looked {
    /// The data diverged from the majority's: the rebuild request, with its proof (and the
    /// database file judged, when it was hashed offline).
    Diverged(Box<RebuildRequest>, Option<Fingerprint>),
    /// The data was judged and proves nothing (it agrees, no majority, …): why.
    Judged(String, Option<Fingerprint>),
    /// Nothing was judged this time, and why (no cluster answers, etcd holds the file, …).
    NotYet(String),
}

/// Pure: whether a look is due now. `down_for`: how long this pod's etcd has not answered
/// (`None`: it answers); `since_try`: since the last look began; `db`: the database file
/// now (`None`: none); `judged`: the file as last judged and how long ago; `held`: a
/// rebuild request is held already.
pub fn due(
    down_for: Option<Duration>,
    since_try: Option<Duration>,
    db: Option<Fingerprint>,
    judged: Option<(Fingerprint, Duration)>,
    held: bool,
) -> bool {
    let Some(db) = db else { return false };
    down_for.is_some_and(|d| d >= DOWN_FOR)
        && since_try.is_none_or(|t| t >= RETRY)
        && !held
        && judged.is_none_or(|(f, ago)| f != db || ago >= REJUDGE)
}

/// What a look needs, cloned into its task.
#[derive(Clone)]
struct Ctx<D, C> {
    /// The offline hash's tools (none without backups: then only the look once etcd
    /// serves again).
    setup: Option<DrillSetup>,
    identity: Identity,
    top_ordinal: u32,
    dns: D,
    connector: C,
    data_dir: PathBuf,
}

/// Looks at this pod's data while its etcd does not run.
pub struct RefusedLook<D, C> {
    ctx: Ctx<D, C>,
    inbox: Arc<Inbox<RebuildRequest>>,
    down_since: Option<Instant>,
    last_try: Option<Instant>,
    judged: Option<(Fingerprint, Instant)>,
    task: Option<JoinHandle<Looked>>,
    /// The last reason logged, so that each is logged once.
    said: Option<String>,
    /// etcd was silent for [`DOWN_FOR`]: once it serves here again as a voter, its data is
    /// judged at once.
    back_pending: bool,
}

impl<D, C> RefusedLook<D, C>
where
    D: Dns + Clone + 'static,
    C: Connector + Clone + 'static,
{
    /// Requests go in `inbox` (the one `/peer/rebuild` fills, which `init` reads); the
    /// offline hash only with backups configured (the restore tool and the scratch space).
    pub fn new(cfg: &Config, dns: D, connector: C, inbox: Arc<Inbox<RebuildRequest>>) -> Self {
        RefusedLook {
            ctx: Ctx {
                setup: cfg.backup.as_ref().map(|b| DrillSetup {
                    tool: b.tool.clone(),
                    etcd_bin: cfg.etcd_bin.clone(),
                    scratch_dir: b.scratch_dir.clone(),
                    start_timeout: Duration::from_secs(30),
                    auth: cfg.etcd.auth.clone(),
                }),
                identity: cfg.identity.clone(),
                top_ordinal: cfg.replicas.max(cfg.identity.ordinal + 1) + 2,
                dns,
                connector,
                data_dir: cfg.data_dir.clone(),
            },
            inbox,
            down_since: None,
            last_try: None,
            judged: None,
            task: None,
            said: None,
            back_pending: false,
        }
    }

    /// One tick: `serving` is this pod's member ID and whether it is a learner, when its
    /// etcd answered this tick.
    pub async fn tick(&mut self, serving: Option<(u64, bool)>, now: Instant) {
        if let Some(task) = self.task.take_if(|t| t.is_finished()) {
            match task.await {
                Ok(looked) => self.take(looked, now),
                Err(e) => {
                    tracing::warn!(error = %e, "the look at this member's data ended abnormally")
                }
            }
        }
        if let Some((member, learner)) = serving {
            self.down_since = None;
            if self.back_pending && !learner && self.task.is_none() {
                self.back_pending = false;
                if self.inbox.current().is_none() {
                    self.task = Some(tokio::spawn(online_look(self.ctx.clone(), member)));
                }
            }
            return;
        }
        let since = *self.down_since.get_or_insert(now);
        let down_for = now.duration_since(since);
        if down_for >= DOWN_FOR {
            self.back_pending = true;
        }
        if self.ctx.setup.is_none() || self.task.is_some() {
            return;
        }
        let go = due(
            Some(down_for),
            self.last_try.map(|t| now.duration_since(t)),
            fingerprint(&db_file(&self.ctx.data_dir)),
            self.judged.map(|(f, at)| (f, now.duration_since(at))),
            self.inbox.current().is_some(),
        );
        if let (true, Some(setup)) = (go, self.ctx.setup.clone()) {
            self.last_try = Some(now);
            self.task = Some(tokio::spawn(offline_look(self.ctx.clone(), setup)));
        }
    }

    fn take(&mut self, looked: Looked, now: Instant) {
        match looked {
            Looked::Diverged(request, f) => {
                if let Some(f) = f {
                    self.judged = Some((f, now));
                }
                let member = format!("{:x}", request.member);
                let verdict = request.check.verdict.to_string();
                let offline = f.is_some();
                match self.inbox.take(*request) {
                    Taken::Held | Taken::AlreadyHeld => {
                        tracing::error!(%member, %verdict, offline, "this member's data diverged from the majority's, judged by its own sidecar (offline: its etcd does not start; online: right after it started again): a rebuild request is held; init sets the data aside at its next start and the member joins again as a new one")
                    }
                    Taken::Conflict(other) => {
                        tracing::warn!(%member, %verdict, held = %other, "this member's data diverged from the majority's, but another request is held")
                    }
                }
                self.said = None;
            }
            Looked::Judged(why, Some(f)) => {
                self.judged = Some((f, now));
                tracing::warn!(verdict = %why, "this member's etcd does not start; its database file, hashed offline, proves no divergence: nothing is set aside (it is judged again when the file changes)");
            }
            Looked::Judged(why, None) => {
                tracing::info!(verdict = %why, "this member serves again after its etcd was silent; its data, judged at once against every voter's, proves no divergence");
            }
            Looked::NotYet(why) => {
                if self.said.as_ref() != Some(&why) {
                    tracing::info!(reason = %why, "this member's data is not judged yet");
                    self.said = Some(why);
                }
            }
        }
    }
}

/// The volume's member and the voters the cluster lists, when this member is one of them
/// and no learner joins; or why nothing can be judged now.
async fn voters_with<D: Dns, C: Connector>(
    ctx: &Ctx<D, C>,
) -> Result<(u64, Vec<MemberInfo>), String> {
    let wal = crate::volume::inspect(&ctx.data_dir)
        .ok()
        .and_then(|s| s.wal_identity())
        .ok_or("the volume's WAL names no member")?;
    let members = cluster(ctx, wal.cluster_id).await.ok_or_else(|| {
        format!(
            "no other member of cluster {:x} answers with a leader: nothing is judged on silence",
            wal.cluster_id
        )
    })?;
    if members.iter().any(|m| m.is_learner) {
        return Err("a learner is joining: one member is rebuilt at a time".into());
    }
    if !members.iter().any(|m| m.id == wal.member_id) {
        return Err(format!(
            "the cluster does not list member {:x} as a voter: init decides",
            wal.member_id
        ));
    }
    Ok((wal.member_id, members))
}

/// Once etcd serves again as voter `me` after a silence: every voter's `HashKV` at one
/// common revision, asked from here, judged by the same rule.
async fn online_look<D: Dns, C: Connector>(ctx: Ctx<D, C>, me: u64) -> Looked {
    let members = match voters_with(&ctx).await {
        Ok((wal, members)) if wal == me => members,
        Ok((wal, _)) => {
            return Looked::NotYet(format!(
                "etcd serves as member {me:x}, the volume's WAL names {wal:x}"
            ))
        }
        Err(why) => return Looked::NotYet(why),
    };
    let round = ask_hashes(&ctx.dns, &ctx.connector, &members).await;
    let now = crate::clock::unix_now();
    match own_proof(me, round, now, now + crate::control::REQUEST_TTL.as_secs()) {
        Ok(request) => Looked::Diverged(Box::new(request), None),
        Err(why) => Looked::Judged(why, None),
    }
}

/// While etcd does not run: the cluster, the file's hash offline, every other voter's at
/// its revision.
async fn offline_look<D: Dns, C: Connector>(ctx: Ctx<D, C>, setup: DrillSetup) -> Looked {
    let (me, members) = match voters_with(&ctx).await {
        Ok(got) => got,
        Err(why) => return Looked::NotYet(why),
    };
    let voters: Vec<u64> = members.iter().map(|m| m.id).collect();
    let (own, f) = match hash_db_file(&setup, &db_file(&ctx.data_dir)).await {
        Ok(got) => got,
        Err(e) => return Looked::NotYet(e),
    };
    let others = join_all(
        members
            .iter()
            .filter(|m| m.id != me)
            .map(|m| ask(&ctx, m, own.revision)),
    )
    .await;
    let now = crate::clock::unix_now();
    match offline_proof(
        me,
        &voters,
        own.revision,
        (own.hash, own.compact_revision),
        others,
        now,
        now + crate::control::REQUEST_TTL.as_secs(),
    ) {
        Ok(request) => Looked::Diverged(Box::new(request), Some(f)),
        Err(why) => Looked::Judged(why, Some(f)),
    }
}

/// The member list of cluster `cluster_id` as the first other pod whose etcd sees a leader
/// has it.
async fn cluster<D: Dns, C: Connector>(
    ctx: &Ctx<D, C>,
    cluster_id: u64,
) -> Option<Vec<MemberInfo>> {
    let me = ctx.identity.ordinal;
    for o in (0..ctx.top_ordinal).filter(|o| *o != me) {
        let url = ctx.identity.client_url(o);
        let Ok(m) = connect_url(&ctx.dns, &ctx.connector, Some(&url)).await else {
            continue;
        };
        let Ok(Ok(s)) = tokio::time::timeout(ASK_TIMEOUT, m.status()).await else {
            continue;
        };
        if s.leader == 0 || s.cluster_id != cluster_id {
            continue;
        }
        if let Ok(Ok((_, members))) = tokio::time::timeout(ASK_TIMEOUT, m.members()).await {
            return Some(members);
        }
    }
    None
}

/// Member `m`'s `HashKV` at `revision`, asked from here.
async fn ask<D: Dns, C: Connector>(ctx: &Ctx<D, C>, m: &MemberInfo, revision: i64) -> HashAnswer {
    let url = m.client_urls.first().map(String::as_str);
    let got = match hash_kv_at(&ctx.dns, &ctx.connector, url, revision).await {
        Ok((hash, compact_revision)) => Answered::Hash {
            hash,
            compact_revision,
        },
        Err(error) => Answered::NoAnswer { error },
    };
    HashAnswer { member: m.id, got }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: Fingerprint = Fingerprint {
        len: 4096,
        modified: None,
    };
    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_member_down_long_enough_with_a_database_is_looked_at_once_per_file() {
        assert!(due(Some(S(10)), None, Some(F), None, false));
        // Starting, or answering: not yet.
        assert!(!due(Some(S(3)), None, Some(F), None, false));
        assert!(!due(None, None, Some(F), None, false));
        // No database file: nothing to hash.
        assert!(!due(Some(S(60)), None, None, None, false));
        // Judged already: again only once it changed, or after a long while.
        assert!(!due(
            Some(S(60)),
            Some(S(60)),
            Some(F),
            Some((F, S(60))),
            false
        ));
        let grown = Fingerprint { len: 8192, ..F };
        assert!(due(
            Some(S(60)),
            Some(S(60)),
            Some(grown),
            Some((F, S(60))),
            false
        ));
        assert!(due(
            Some(S(60)),
            Some(S(60)),
            Some(F),
            Some((F, REJUDGE)),
            false
        ));
        // A look that proved nothing is retried, not at every tick.
        assert!(!due(Some(S(60)), Some(S(2)), Some(F), None, false));
        // A request held already (the leader's, or an earlier look's): nothing more.
        assert!(!due(Some(S(60)), None, Some(F), None, true));
    }
}
