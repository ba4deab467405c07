//! The defragmentation settings, as configuration builds them and the defragmentation
//! planner reads them (`--defrag-threshold`, `--defrag-schedule`, `--quota-backend-bytes`).
//! A leaf: imports only [`crate::units`].

use std::fmt;
use std::time::Duration;

use crate::units::{parse_size, Bytes};

/// `--defrag-threshold`: defragment when both the free share and the free bytes are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Threshold {
    /// Free share of the file, in percent (1..=100).
    pub free_percent: u8,
    /// Free bytes.
    pub free_bytes: u64,
}

impl Threshold {
    /// Parses `PERCENT%,SIZE` (e.g. `50%,100MiB`; SIZE in B, KiB, MiB, GiB, or KB, MB, GB);
    /// `0` is off (`None`).
    pub fn parse(s: &str) -> Result<Option<Threshold>, String> {
        let s = s.trim();
        if s == "0" || s.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let (ratio, bytes) = s.split_once(',').ok_or_else(|| {
            format!("expected PERCENT%,SIZE such as 50%,100MiB (or 0 for off), got {s:?}")
        })?;
        let free_percent = ratio
            .trim()
            .strip_suffix('%')
            .and_then(|p| p.trim().parse::<u8>().ok())
            .filter(|p| (1..=100).contains(p))
            .ok_or_else(|| {
                format!("the free share must be a percentage from 1% to 100%, got {ratio:?}")
            })?;
        let free_bytes = parse_size(bytes.trim())?;
        Ok(Some(Threshold {
            free_percent,
            free_bytes,
        }))
    }

    /// Whether a file of `db_size` bytes with `in_use` bytes in use is fragmented beyond it.
    pub fn reached(&self, db_size: u64, in_use: u64) -> bool {
        let free = db_size.saturating_sub(in_use);
        free > 0
            && free >= self.free_bytes
            && free.saturating_mul(100) >= db_size.saturating_mul(u64::from(self.free_percent))
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}% and {} free",
            self.free_percent,
            Bytes(self.free_bytes)
        )
    }
}

/// The validated defragmentation options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefragPolicy {
    /// `None`: no defragmentation for fragmentation alone (`--defrag-threshold=0`).
    pub threshold: Option<Threshold>,
    /// `--defrag-schedule`: also defragment this often, fragmented or not.
    pub schedule: Option<Duration>,
    /// `--quota-backend-bytes`, as etcd is given it: what NOSPACE is measured against.
    pub quota: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn threshold_parses_percent_and_size_or_off() {
        assert_eq!(
            Threshold::parse("50%,100MiB"),
            Ok(Some(Threshold {
                free_percent: 50,
                free_bytes: 100 * MIB
            }))
        );
        assert_eq!(Threshold::parse("0"), Ok(None));
        assert!(Threshold::parse("50%").is_err());
        assert!(Threshold::parse("150%,1MiB").is_err());
        assert!(Threshold::parse("50%,1XB").is_err());
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("16777216"), Ok(16 << 20));
    }
}
