//! Sizes and durations: how the options write them and how the sidecar, `status` and the
//! logs show them. A leaf: imports nothing of the crate.

use std::fmt;
use std::time::Duration;

/// A byte count such as `100MiB`, `8GiB`, `512KB` or `1048576`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(digits);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("a size must be a whole number of bytes with an optional unit (B, KiB, MiB, GiB, KB, MB, GB), got {s:?}"))?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "Ki" => 1 << 10,
        "MiB" | "Mi" => 1 << 20,
        "GiB" | "Gi" => 1 << 30,
        "KB" | "K" => 1_000,
        "MB" | "M" => 1_000_000,
        "GB" | "G" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?} (use B, KiB, MiB, GiB, KB, MB or GB)"
            ))
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// Bytes, rendered for people: `1.5 GiB`, `12.0 MiB`, or `512 B` under a MiB.
#[derive(Debug, Clone, Copy)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b >= 1 << 30 {
            write!(f, "{:.1} GiB", b as f64 / f64::from(1u32 << 30))
        } else if b >= 1 << 20 {
            write!(f, "{:.1} MiB", b as f64 / f64::from(1u32 << 20))
        } else {
            write!(f, "{b} B")
        }
    }
}

/// A size as `status` shows a member's database file: GiB from 1 GiB, MiB below (so small
/// files read `0.1 MiB`, not bytes), `-` when unknown.
pub fn mib_or_gib(bytes: Option<i64>) -> String {
    match bytes {
        None => "-".into(),
        Some(b) if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        Some(b) => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
    }
}

/// A duration of at least `min`; the error says the minimum with an `example`, in the words
/// the options use: `must be a duration of at least 1s such as 30s or 5m, got "0s"`.
pub fn parse_duration_at_least(s: &str, min: Duration, example: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d >= min => Ok(d),
        _ => Err(format!(
            "must be a duration of at least {} such as {example}, got {s:?}",
            humantime::format_duration(min)
        )),
    }
}

/// A moment an operator names (`--to-time`, `--restore time:`): RFC 3339 with its offset,
/// `Z` or any other (`2026-11-27T10:01:59Z`, `2026-11-27T11:01:59+01:00`, as `date -Iseconds`
/// prints), fractions of a second kept; as Unix milliseconds, after 1970. A time without an
/// offset is refused: it would mean another moment on each machine.
pub fn parse_moment(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<jiff::Timestamp>()
        .ok()
        .and_then(|t| u64::try_from(t.as_millisecond()).ok())
        .filter(|ms| *ms > 0)
        .ok_or_else(|| {
            format!(
                "needs an RFC 3339 time with its offset, after 1970, such as \
                 2026-11-27T10:01:59Z or 2026-11-27T11:01:59+01:00, got {s:?}"
            )
        })
}

/// A moment as `status` shows it: RFC 3339 in UTC and how long before `now` (Unix seconds
/// both): `2026-11-27T15:31:09Z (4m ago)`.
pub fn moment(ts: u64, now: u64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_secs(ts);
    format!(
        "{} ({})",
        humantime::format_rfc3339_seconds(at),
        ago(ts, now)
    )
}

/// How long before `now` `ts` was, in its two largest units: `just now`, `40s ago`,
/// `4m ago`, `2h5m ago`, `3d4h ago`; `in 5s` for a moment after `now` (another pod's clock).
pub fn ago(ts: u64, now: u64) -> String {
    let (secs, later) = match now.checked_sub(ts) {
        Some(d) => (d, false),
        None => (ts - now, true),
    };
    let span = match secs {
        0 => return "just now".into(),
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => match (s / 3600, s % 3600 / 60) {
            (h, 0) => format!("{h}h"),
            (h, m) => format!("{h}h{m}m"),
        },
        s => match (s / 86_400, s % 86_400 / 3600) {
            (d, 0) => format!("{d}d"),
            (d, h) => format!("{d}d{h}h"),
        },
    };
    if later {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_read_as_a_date_and_how_long_ago() {
        let now = 1_795_629_450;
        assert_eq!(
            moment(now - 4 * 60 - 12, now),
            "2026-11-25T17:53:18Z (4m ago)"
        );
        assert_eq!(ago(now, now), "just now");
        assert_eq!(ago(now - 40, now), "40s ago");
        assert_eq!(ago(now - 2 * 3600 - 5 * 60, now), "2h5m ago");
        assert_eq!(ago(now - 3600, now), "1h ago");
        assert_eq!(ago(now - 3 * 86_400 - 4 * 3600 - 7, now), "3d4h ago");
        assert_eq!(ago(now + 5, now), "in 5s");
    }

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("100MiB"), Ok(100 << 20));
        assert_eq!(parse_size("8Gi"), Ok(8 << 30));
        assert_eq!(parse_size("512KB"), Ok(512_000));
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999GiB").is_err());
    }

    #[test]
    fn sizes_show_for_people() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(3 << 20).to_string(), "3.0 MiB");
        assert_eq!(Bytes(3 << 29).to_string(), "1.5 GiB");
        assert_eq!(mib_or_gib(None), "-");
        assert_eq!(mib_or_gib(Some(25 << 20)), "25.0 MiB");
        assert_eq!(mib_or_gib(Some(2 << 30)), "2.0 GiB");
    }

    #[test]
    fn a_moment_is_read_with_any_offset_and_one_without_is_refused() {
        let at = 1_764_237_719_000; // 2025-11-27T10:01:59Z
        assert_eq!(parse_moment("2025-11-27T10:01:59Z"), Ok(at));
        assert_eq!(parse_moment("2025-11-27T10:01:59+00:00"), Ok(at));
        assert_eq!(parse_moment("2025-11-27T11:01:59+01:00"), Ok(at));
        assert_eq!(parse_moment("2025-11-27T05:01:59.250-05:00"), Ok(at + 250));
        for bad in [
            "2025-11-27 10:01:59",
            "2025-11-27T10:01:59",
            "yesterday",
            "",
            "1960-01-01T00:00:00Z",
        ] {
            let e = parse_moment(bad).err().unwrap_or_default();
            assert!(
                e.contains("with its offset") && e.contains(&format!("{bad:?}")),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn durations_have_a_minimum() {
        let one = Duration::from_secs(1);
        assert_eq!(
            parse_duration_at_least("5m", one, "30s"),
            Ok(Duration::from_secs(300))
        );
        assert_eq!(
            parse_duration_at_least("0s", one, "30s or 5m"),
            Err("must be a duration of at least 1s such as 30s or 5m, got \"0s\"".into())
        );
        assert!(parse_duration_at_least("soon", one, "30s").is_err());
        assert_eq!(
            parse_duration_at_least("24h", one, "30s"),
            Ok(Duration::from_secs(86_400))
        );
    }
}
