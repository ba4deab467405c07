//! [`FakeCluster`]: etcd in memory, behind [`Connector`] and [`Etcd`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::etcd::{Connector, Etcd, EtcdError, MemberInfo, MemberStatus};
use crate::identity::split_url;

/// Which call a [`Call`] records, or a failure is scripted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Connect,
    Status,
    Members,
    LinearizableRead,
    SerializableRead,
    AddLearner,
    Remove,
    Promote,
    UpdatePeerUrls,
    Defragment,
    HashKv,
    DisarmNospace,
    TryLock,
    Unlock,
}

/// One call the code under test made, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// `host:port` as the connection was opened to.
    pub endpoint: String,
    pub op: Op,
    /// The member ID (remove, promote) or peer URL (add learner) the call named.
    pub arg: Option<String>,
}

/// How many times a scripted failure fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Times {
    N(u32),
    Always,
}

#[derive(Debug, Clone)]
struct Failure {
    /// `None`: on every endpoint.
    endpoint: Option<String>,
    op: Op,
    error: EtcdError,
    left: Times,
}

/// One member of the fake cluster.
#[derive(Debug, Clone)]
struct Member {
    info: MemberInfo,
    raft_index: u64,
    up: bool,
    errors: Vec<String>,
    /// The database file's size and the part in use.
    db: (i64, i64),
    /// What `HashKV` answers (hash, compacted revision).
    hash: (u32, i64),
}

#[derive(Debug)]
struct State {
    cluster_id: u64,
    /// 0: no leader.
    leader: u64,
    raft_term: u64,
    members: Vec<Member>,
    next_id: u64,
    calls: Vec<Call>,
    failures: Vec<Failure>,
    /// Calls that take this long (in tokio time) before they are answered.
    delays: Vec<(String, Op, Duration)>,
    /// The lease holding a lock key, by key.
    locks: HashMap<String, i64>,
}

/// An etcd cluster in memory. Clones share the same cluster.
#[derive(Debug, Clone)]
pub struct FakeCluster {
    state: Arc<Mutex<State>>,
}

impl Default for FakeCluster {
    fn default() -> Self {
        Self::new(0xc1)
    }
}

impl FakeCluster {
    /// An empty cluster with this cluster ID and no leader.
    pub fn new(cluster_id: u64) -> Self {
        FakeCluster {
            state: Arc::new(Mutex::new(State {
                cluster_id,
                leader: 0,
                raft_term: 1,
                members: Vec::new(),
                next_id: 0x1000,
                calls: Vec::new(),
                failures: Vec::new(),
                delays: Vec::new(),
                locks: HashMap::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock has failed already; keep its state.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a started member (named, up, raft index 0) listening on `client_url`.
    pub fn add_member(
        &self,
        id: u64,
        name: &str,
        peer_url: &str,
        client_url: &str,
        is_learner: bool,
    ) {
        self.lock().members.push(Member {
            info: MemberInfo {
                id,
                name: name.to_string(),
                peer_urls: vec![peer_url.to_string()],
                client_urls: vec![client_url.to_string()],
                is_learner,
            },
            raft_index: 0,
            up: true,
            errors: Vec::new(),
            db: (0, 0),
            hash: (0x5eed, 1),
        });
    }

    /// Makes `id` the leader (0: no leader, as without quorum).
    pub fn set_leader(&self, id: u64) {
        let mut s = self.lock();
        s.leader = id;
        s.raft_term += 1;
    }

    /// Sets how far member `id` has applied the log.
    pub fn set_raft_index(&self, id: u64, index: u64) {
        if let Some(m) = self.lock().members.iter_mut().find(|m| m.info.id == id) {
            m.raft_index = index;
        }
    }

    /// A member that is down answers no call (as a stopped process or a cut network).
    pub fn set_up(&self, id: u64, up: bool) {
        if let Some(m) = self.lock().members.iter_mut().find(|m| m.info.id == id) {
            m.up = up;
        }
    }

    /// Alarms member `id` reports in its status (NOSPACE, CORRUPT, …).
    pub fn set_errors(&self, id: u64, errors: &[&str]) {
        if let Some(m) = self.lock().members.iter_mut().find(|m| m.info.id == id) {
            m.errors = errors.iter().map(|e| e.to_string()).collect();
        }
    }

    /// What member `id` answers to `HashKV` (every member answers `0x5eed` from
    /// compacted revision 1 until told otherwise).
    pub fn set_hash(&self, id: u64, hash: u32) {
        if let Some(m) = self.lock().members.iter_mut().find(|m| m.info.id == id) {
            m.hash.0 = hash;
        }
    }

    /// Makes `op` on `endpoint` (`host:port`) fail with `error`, `times` times.
    /// Sets member `id`'s database file size and the part of it in use.
    pub fn set_db_size(&self, id: u64, size: i64, in_use: i64) {
        if let Some(m) = self.lock().members.iter_mut().find(|m| m.info.id == id) {
            m.db = (size, in_use);
        }
    }

    /// Another client holds lock `key` (`None`: nobody does).
    pub fn hold_lock(&self, key: &str, held: bool) {
        let mut s = self.lock();
        if held {
            s.locks.insert(key.to_string(), -1);
        } else {
            s.locks.remove(key);
        }
    }

    /// The locks held, by key.
    pub fn locks(&self) -> Vec<String> {
        self.lock().locks.keys().cloned().collect()
    }

    pub fn fail(&self, endpoint: &str, op: Op, error: EtcdError, times: Times) {
        self.lock().failures.push(Failure {
            endpoint: Some(endpoint.to_string()),
            op,
            error,
            left: times,
        });
    }

    /// Makes `op` fail with `error` on every endpoint, `times` times in all.
    pub fn fail_everywhere(&self, op: Op, error: EtcdError, times: Times) {
        self.lock().failures.push(Failure {
            endpoint: None,
            op,
            error,
            left: times,
        });
    }

    /// Makes `op` on `endpoint` answer only after `delay` (tokio time: with a paused clock
    /// it costs the test nothing), as a busy or hung member does.
    pub fn delay(&self, endpoint: &str, op: Op, delay: Duration) {
        self.lock().delays.push((endpoint.to_string(), op, delay));
    }

    /// The members as the cluster lists them now.
    pub fn members(&self) -> Vec<MemberInfo> {
        self.lock().members.iter().map(|m| m.info.clone()).collect()
    }

    /// Member `id`, if it is in the cluster.
    pub fn member(&self, id: u64) -> Option<MemberInfo> {
        self.lock()
            .members
            .iter()
            .find(|m| m.info.id == id)
            .map(|m| m.info.clone())
    }

    /// Every call made so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The calls of kind `op`, in order.
    pub fn calls_of(&self, op: Op) -> Vec<Call> {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.op == op)
            .cloned()
            .collect()
    }

    pub fn clear_calls(&self) {
        self.lock().calls.clear();
    }
}

impl State {
    /// Records the call, then returns the scripted failure it meets, if any.
    fn enter(&mut self, endpoint: &str, op: Op, arg: Option<String>) -> Result<(), EtcdError> {
        self.calls.push(Call {
            endpoint: endpoint.to_string(),
            op,
            arg,
        });
        let hit = self.failures.iter_mut().position(|f| {
            f.op == op
                && f.endpoint.as_deref().is_none_or(|e| e == endpoint)
                && f.left != Times::N(0)
        });
        let Some(i) = hit else { return Ok(()) };
        let failure = &mut self.failures[i];
        if let Times::N(n) = &mut failure.left {
            *n -= 1;
        }
        Err(failure.error.clone())
    }

    /// The member a connection to `endpoint` reaches, when it is up.
    fn reach(&self, endpoint: &str) -> Result<&Member, EtcdError> {
        self.members
            .iter()
            .find(|m| {
                m.info.client_urls.iter().any(|u| {
                    split_url(u).is_some_and(|(host, port)| format!("{host}:{port}") == endpoint)
                })
            })
            .filter(|m| m.up)
            .ok_or_else(|| EtcdError::Unreachable {
                endpoint: endpoint.to_string(),
                detail: "connection refused (fake: no member up there)".into(),
            })
    }

    fn leader(&self) -> Option<&Member> {
        self.members
            .iter()
            .find(|m| m.info.id == self.leader && m.up && self.leader != 0)
    }

    /// A voter reached at `endpoint`, with a live leader: what membership changes need.
    fn voter_with_leader(&self, endpoint: &str) -> Result<u64, EtcdError> {
        let me = self.reach(endpoint)?;
        if me.info.is_learner {
            return Err(EtcdError::Other {
                endpoint: endpoint.to_string(),
                detail: "rpc not supported for learner".into(),
            });
        }
        self.leader()
            .map(|l| l.raft_index)
            .ok_or_else(|| EtcdError::TimedOut {
                endpoint: endpoint.to_string(),
                detail: "no leader (fake)".into(),
            })
    }
}

/// A connection to one member of a [`FakeCluster`].
#[derive(Debug, Clone)]
pub struct FakeMember {
    cluster: FakeCluster,
    endpoint: String,
}

impl Connector for FakeCluster {
    type Member = FakeMember;

    async fn connect(&self, host: &str, _ip: IpAddr, port: u16) -> Result<FakeMember, EtcdError> {
        let endpoint = format!("{host}:{port}");
        self.lock().enter(&endpoint, Op::Connect, None)?;
        Ok(FakeMember {
            cluster: self.clone(),
            endpoint,
        })
    }
}

impl FakeMember {
    async fn call<T>(
        &self,
        op: Op,
        arg: Option<String>,
        f: impl FnOnce(&mut State, &str) -> Result<T, EtcdError>,
    ) -> Result<T, EtcdError> {
        let delay = self
            .cluster
            .lock()
            .delays
            .iter()
            .find(|(e, o, _)| *e == self.endpoint && *o == op)
            .map(|(_, _, d)| *d);
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let mut s = self.cluster.lock();
        s.enter(&self.endpoint, op, arg)?;
        f(&mut s, &self.endpoint)
    }
}

impl Etcd for FakeMember {
    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn status(&self) -> Result<MemberStatus, EtcdError> {
        self.call(Op::Status, None, |s, e| {
            let m = s.reach(e)?;
            let leader = s.leader().map(|l| l.info.id).unwrap_or(0);
            Ok(MemberStatus {
                member_id: m.info.id,
                cluster_id: s.cluster_id,
                leader,
                raft_index: m.raft_index,
                raft_term: s.raft_term,
                is_learner: m.info.is_learner,
                errors: m.errors.clone(),
                db_size: m.db.0,
                db_size_in_use: m.db.1,
                revision: i64::try_from(m.raft_index).unwrap_or(i64::MAX),
                ..Default::default()
            })
        })
        .await
    }

    async fn members(&self) -> Result<(u64, Vec<MemberInfo>), EtcdError> {
        self.call(Op::Members, None, |s, e| {
            s.reach(e)?;
            Ok((
                s.cluster_id,
                s.members.iter().map(|m| m.info.clone()).collect(),
            ))
        })
        .await
    }

    async fn linearizable_read(&self) -> Result<(), EtcdError> {
        self.call(Op::LinearizableRead, None, |s, e| {
            s.voter_with_leader(e).map(drop)
        })
        .await
    }

    async fn serializable_read(&self) -> Result<(), EtcdError> {
        self.call(Op::SerializableRead, None, |s, e| s.reach(e).map(drop))
            .await
    }

    async fn add_learner(&self, peer_url: &str) -> Result<MemberInfo, EtcdError> {
        self.call(Op::AddLearner, Some(peer_url.to_string()), |s, e| {
            s.voter_with_leader(e)?;
            if s.members
                .iter()
                .any(|m| m.info.peer_urls.iter().any(|u| u == peer_url))
            {
                return Err(EtcdError::PeerUrlExists);
            }
            if s.members.iter().any(|m| m.info.is_learner) {
                return Err(EtcdError::TooManyLearners);
            }
            s.next_id += 1;
            let info = MemberInfo {
                id: s.next_id,
                name: String::new(),
                peer_urls: vec![peer_url.to_string()],
                client_urls: Vec::new(),
                is_learner: true,
            };
            s.members.push(Member {
                info: info.clone(),
                raft_index: 0,
                up: false,
                errors: Vec::new(),
                db: (0, 0),
                hash: (0x5eed, 1),
            });
            Ok(info)
        })
        .await
    }

    async fn remove(&self, id: u64) -> Result<(), EtcdError> {
        self.call(Op::Remove, Some(format!("{id:x}")), |s, e| {
            s.voter_with_leader(e)?;
            let before = s.members.len();
            s.members.retain(|m| m.info.id != id);
            if s.members.len() == before {
                return Err(EtcdError::MemberNotFound { id });
            }
            Ok(())
        })
        .await
    }

    async fn update_peer_urls(&self, id: u64, urls: &[String]) -> Result<(), EtcdError> {
        self.call(Op::UpdatePeerUrls, Some(format!("{id:x}")), |s, e| {
            s.voter_with_leader(e)?;
            let m = s
                .members
                .iter_mut()
                .find(|m| m.info.id == id)
                .ok_or(EtcdError::MemberNotFound { id })?;
            m.info.peer_urls = urls.to_vec();
            Ok(())
        })
        .await
    }

    async fn promote(&self, id: u64) -> Result<(), EtcdError> {
        self.call(Op::Promote, Some(format!("{id:x}")), |s, e| {
            let leader_index = s.voter_with_leader(e)?;
            let m = s
                .members
                .iter_mut()
                .find(|m| m.info.id == id)
                .ok_or(EtcdError::MemberNotFound { id })?;
            if !m.info.is_learner {
                return Err(EtcdError::AlreadyVoter { id });
            }
            // etcd's isLearnerReady: the learner's match index within 90% of the leader's.
            if u128::from(m.raft_index) * 10 < u128::from(leader_index) * 9 {
                return Err(EtcdError::LearnerNotReady { id });
            }
            m.info.is_learner = false;
            Ok(())
        })
        .await
    }

    async fn defragment(&self) -> Result<(), EtcdError> {
        self.call(Op::Defragment, None, |s, e| {
            let id = s.reach(e)?.info.id;
            if let Some(m) = s.members.iter_mut().find(|m| m.info.id == id) {
                m.db.0 = m.db.1;
            }
            Ok(())
        })
        .await
    }

    async fn hash_kv(&self, _revision: i64) -> Result<(u32, i64), EtcdError> {
        self.call(Op::HashKv, None, |s, e| Ok(s.reach(e)?.hash))
            .await
    }

    async fn disarm(&self, alarm: crate::etcd::Alarm) -> Result<usize, EtcdError> {
        self.call(Op::DisarmNospace, None, |s, e| {
            s.voter_with_leader(e)?;
            let mut n = 0;
            for m in &mut s.members {
                let before = m.errors.len();
                m.errors.retain(|x| !x.contains(alarm.word()));
                n += before - m.errors.len();
            }
            Ok(n)
        })
        .await
    }

    async fn try_lock(&self, key: &str, _value: &str, _ttl: i64) -> Result<Option<i64>, EtcdError> {
        self.call(Op::TryLock, Some(key.to_string()), |s, e| {
            s.voter_with_leader(e)?;
            if s.locks.contains_key(key) {
                return Ok(None);
            }
            s.next_id += 1;
            let lease = i64::try_from(s.next_id).unwrap_or(i64::MAX);
            s.locks.insert(key.to_string(), lease);
            Ok(Some(lease))
        })
        .await
    }

    async fn unlock(&self, lease: i64) -> Result<(), EtcdError> {
        self.call(Op::Unlock, None, |s, e| {
            s.voter_with_leader(e)?;
            s.locks.retain(|_, l| *l != lease);
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns::Dns;
    use crate::facts::Lookup;
    use crate::fake::FakeDns;

    const A: &str = "http://a.example:2379";
    const B: &str = "http://b.example:2379";

    fn two_members() -> FakeCluster {
        let c = FakeCluster::default();
        c.add_member(1, "a", "http://a.example:2380", A, false);
        c.add_member(2, "b", "http://b.example:2380", B, true);
        c.set_leader(1);
        c.set_raft_index(1, 100);
        c
    }

    async fn at(c: &FakeCluster, host: &str) -> Result<FakeMember, EtcdError> {
        c.connect(host, IpAddr::from([127, 0, 0, 1]), 2379).await
    }

    #[tokio::test]
    async fn a_learner_behind_the_leader_is_refused_promotion_then_promoted(
    ) -> Result<(), EtcdError> {
        let c = two_members();
        let a = at(&c, "a.example").await?;
        c.set_raft_index(2, 89);
        assert_eq!(
            a.promote(2).await,
            Err(EtcdError::LearnerNotReady { id: 2 })
        );
        c.set_raft_index(2, 90);
        a.promote(2).await?;
        assert_eq!(c.member(2).map(|m| m.is_learner), Some(false));
        assert_eq!(a.promote(2).await, Err(EtcdError::AlreadyVoter { id: 2 }));
        Ok(())
    }

    #[tokio::test]
    async fn a_learner_cannot_promote_and_a_down_member_answers_nothing() -> Result<(), EtcdError> {
        let c = two_members();
        c.set_raft_index(2, 100);
        let b = at(&c, "b.example").await?;
        assert!(matches!(b.promote(2).await, Err(EtcdError::Other { .. })));
        c.set_up(2, false);
        assert!(matches!(
            b.status().await,
            Err(EtcdError::Unreachable { .. })
        ));
        Ok(())
    }

    #[tokio::test]
    async fn scripted_failures_fire_the_given_number_of_times_on_their_endpoint(
    ) -> Result<(), EtcdError> {
        let c = two_members();
        c.fail(
            "a.example:2379",
            Op::Status,
            EtcdError::NoLeader,
            Times::N(2),
        );
        let a = at(&c, "a.example").await?;
        let b = at(&c, "b.example").await?;
        assert_eq!(a.status().await, Err(EtcdError::NoLeader));
        assert!(b.status().await.is_ok(), "another endpoint is not affected");
        assert_eq!(a.status().await, Err(EtcdError::NoLeader));
        assert_eq!(a.status().await.map(|s| s.leader), Ok(1));
        assert_eq!(c.calls_of(Op::Status).len(), 4);
        Ok(())
    }

    #[tokio::test]
    async fn one_learner_at_a_time_and_no_membership_change_without_a_leader(
    ) -> Result<(), EtcdError> {
        let c = two_members();
        let a = at(&c, "a.example").await?;
        assert_eq!(
            a.add_learner("http://c.example:2380").await,
            Err(EtcdError::TooManyLearners)
        );
        a.remove(2).await?;
        let added = a.add_learner("http://c.example:2380").await?;
        assert!(added.is_learner && added.name.is_empty());
        c.set_leader(0);
        assert!(matches!(
            a.remove(added.id).await,
            Err(EtcdError::TimedOut { .. })
        ));
        Ok(())
    }

    #[tokio::test]
    async fn fake_dns_answers_what_was_scripted_and_records_lookups() {
        let dns = FakeDns::default();
        dns.answer("a", Lookup::Found(vec![IpAddr::from([10, 0, 0, 1])]));
        dns.answer("b", Lookup::Failed("SERVFAIL".into()));
        assert_eq!(
            dns.lookup("a").await.first(),
            Some(IpAddr::from([10, 0, 0, 1]))
        );
        assert_eq!(dns.lookup("b").await, Lookup::Failed("SERVFAIL".into()));
        assert_eq!(dns.lookup("c").await, Lookup::NotFound);
        assert_eq!(dns.lookups(), vec!["a", "b", "c"]);
    }
}
