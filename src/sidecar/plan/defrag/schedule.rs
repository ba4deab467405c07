//! `--defrag-schedule`'s arithmetic: the wall-clock period and this member's slot in it.

use std::time::Duration;

/// Where `--defrag-schedule` puts a member in the wall clock. The schedule's periods are
/// aligned to unix time (period `p` starts at `p × every`), so every sidecar sees the same
/// period; each period is cut into one slot per member, in the defragmentation order
/// (followers by member ID, the leader last). A member is due from the start of its slot
/// until it has been defragmented in that period: scheduled defragmentations go one after
/// another, the leader's last, not all at once when the period turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The period `unix` falls in.
    pub period: u64,
    /// Whether `unix` is at or past the start of this member's slot in that period.
    pub reached: bool,
}

/// The slot of the member at `position` (0-based) of `members` in the order, at `unix`.
pub fn schedule_slot(every: Duration, unix: u64, position: usize, members: usize) -> Slot {
    let every = every.as_secs().max(1);
    let n = u64::try_from(members.max(1)).unwrap_or(u64::MAX);
    let position = u64::try_from(position).unwrap_or(u64::MAX).min(n - 1);
    Slot {
        period: unix / every,
        reached: unix % every >= every / n * position,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_periods_line_up_on_the_wall_clock_and_the_leader_has_the_last_slot() {
        let day = Duration::from_secs(86_400);
        let at = |unix, position| schedule_slot(day, unix, position, 3);
        // Period 10 starts at 864000 for every sidecar; slots at +0, +8h, +16h.
        assert_eq!(
            at(864_000, 0),
            Slot {
                period: 10,
                reached: true
            }
        );
        assert_eq!(
            at(864_000, 1),
            Slot {
                period: 10,
                reached: false
            }
        );
        assert!(at(864_000 + 8 * 3600, 1).reached);
        assert!(!at(864_000 + 8 * 3600, 2).reached, "the leader goes last");
        assert!(at(864_000 + 16 * 3600, 2).reached);
        assert_eq!(at(864_000 + 86_399, 2).period, 10);
        assert_eq!(
            at(864_000 + 86_400, 2),
            Slot {
                period: 11,
                reached: false
            }
        );
        // A position past the list (a member list that shrank) takes the last slot.
        assert_eq!(at(864_000 + 16 * 3600, 7), at(864_000 + 16 * 3600, 2));
    }
}
