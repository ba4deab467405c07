//! Defragmentation and the NOSPACE alarm: `DefragArgs` into a [`DefragPolicy`].

use std::time::Duration;

use super::parse::duration_at_least;
use super::DefragArgs;

impl DefragArgs {
    /// The typed policy; adds every broken constraint to `problems`.
    pub fn validate(&self, problems: &mut Vec<String>) -> crate::policy::DefragPolicy {
        use crate::policy::{DefragPolicy, Threshold};
        use crate::units::parse_size;
        let threshold = Threshold::parse(&self.defrag_threshold).unwrap_or_else(|e| {
            problems.push(format!("--defrag-threshold: {e}"));
            None
        });
        let schedule = self.defrag_schedule.as_deref().and_then(|v| {
            duration_at_least(
                "defrag-schedule",
                v,
                Duration::from_secs(60),
                "24h",
                problems,
            )
        });
        let quota = match parse_size(self.quota_backend_bytes.trim()) {
            Ok(q) if q >= 1 << 20 => q,
            Ok(_) => {
                problems.push(format!(
                    "--quota-backend-bytes must be at least 1MiB, got {:?}",
                    self.quota_backend_bytes
                ));
                0
            }
            Err(e) => {
                problems.push(format!("--quota-backend-bytes: {e}"));
                0
            }
        };
        DefragPolicy {
            threshold,
            schedule,
            quota,
        }
    }
}
