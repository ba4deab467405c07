//! Defragmentation and the space alarm (NOSPACE). etcd's database file never shrinks by
//! itself; each sidecar defragments its own member when the file is fragmented beyond
//! `--defrag-threshold` (or `--defrag-schedule` is due), one member at a time across the
//! cluster: followers first (lowest member ID first), the leader last, only while every
//! member answers. Under NOSPACE it defragments where that brings the file under the quota
//! with margin, then disarms the alarm; when the data really is too large it says so and
//! leaves the alarm to the operator.
//!
//! One at a time holds twice: each member's sidecar sees the same order (every member's
//! status), and the step runs under a lease-held lock key in etcd (`/etcd-steward/defrag`),
//! except under NOSPACE, where etcd refuses the lease (then the order alone serialises).

//!
//! By job: [`decide`] is the pure decision (one look at every member in, what to do out),
//! [`schedule`] the arithmetic of `--defrag-schedule`'s wall-clock slots, [`planner`] the
//! stateful planner that builds the decision's input from each observation and remembers
//! what came of its steps. The settings are [`crate::policy`]'s; the lock and the step
//! itself are the executor's (`sidecar::execute::defrag`).

pub mod decide;
pub mod planner;
pub mod schedule;

use std::time::Duration;

pub use crate::policy::{DefragPolicy, Threshold};
pub use crate::units::{parse_size, Bytes};
pub use decide::{decide, Decision, DefragWhy, Input, MemberView, Wait};
pub use planner::Defrag;
pub use schedule::{schedule_slot, Slot};

/// The lock key every sidecar takes before it defragments its member.
pub const LOCK_KEY: &str = "/etcd-steward/defrag";
/// After a defragmentation (or a failed one) of this member, the next waits this long.
pub const COOL_DOWN: Duration = Duration::from_secs(60);
/// The same under NOSPACE, where writes wait on every member.
pub const NOSPACE_COOL_DOWN: Duration = Duration::from_secs(5);
/// Under NOSPACE the alarm is disarmed only when every member's file is under this share of
/// the quota (in percent), so that writes do not raise it again at once.
pub const NOSPACE_MARGIN_PERCENT: u64 = 80;
/// Under NOSPACE a member is worth defragmenting when at least this much of its file is free.
pub(crate) const NOSPACE_MIN_FREE: u64 = 1 << 20;

/// What the decision's and the planner's tests share: a policy (50% or 100 MiB free
/// defragments, a 2 GiB quota) and a three-member cluster whose leader is member 3.
#[cfg(test)]
mod fixtures {
    use crate::policy::{DefragPolicy, Threshold};

    pub const MIB: u64 = 1 << 20;
    pub const LEADER: u64 = 3;

    pub fn policy() -> DefragPolicy {
        DefragPolicy {
            threshold: Some(Threshold {
                free_percent: 50,
                free_bytes: 100 * MIB,
            }),
            schedule: None,
            quota: 2048 * MIB,
        }
    }
}
