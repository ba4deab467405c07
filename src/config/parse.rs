//! One parser per kind of value (a port, a DNS label, a duration with a minimum, a size,
//! a TLS file triple, an executable), each adding the constraint it found broken to the
//! run's list of problems, and each used wherever that kind of option appears.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::tls::{TlsFiles, TlsMaterial};

/// A duration option of at least `min` (`--name must be a duration of at least 1s such as
/// 30s, got "…"`); `None`, with the problem added, when it is not one.
pub fn duration_at_least(
    name: &str,
    value: &str,
    min: Duration,
    example: &str,
    problems: &mut Vec<String>,
) -> Option<Duration> {
    crate::units::parse_duration_at_least(value.trim(), min, example)
        .map_err(|why| problems.push(format!("--{name} {why}")))
        .ok()
}

/// Loads one side's TLS files: all three or none; as a server admitting only client
/// certificates named `admit`, when given (`--peer-cert-allowed-cn`).
pub fn tls_side(
    names: [&str; 3],
    files: &[Option<PathBuf>; 3],
    admit: Option<&str>,
    problems: &mut Vec<String>,
) -> Option<TlsMaterial> {
    match files {
        [None, None, None] => None,
        [Some(cert), Some(key), Some(ca)] => {
            let files = TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            };
            match TlsMaterial::load_admitting(&files, admit) {
                Ok(m) => Some(m),
                Err(e) => {
                    problems.push(format!("--{}: {e}", names[0]));
                    None
                }
            }
        }
        _ => {
            problems.push(format!(
                "--{}, --{} and --{} go together: give all three or none",
                names[0], names[1], names[2]
            ));
            None
        }
    }
}

pub fn port(name: &str, value: &str, problems: &mut Vec<String>) -> u16 {
    match value.parse::<u16>() {
        Ok(p) if p > 0 => p,
        _ => {
            problems.push(format!(
                "--{name} must be a port from 1 to 65535, got {value:?}"
            ));
            0
        }
    }
}

pub fn dns_label_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Finds an executable: a path with a `/` as it is, a bare name on `PATH`.
pub fn find_executable(bin: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if bin.components().count() > 1 || bin.is_absolute() {
        return if executable(bin) {
            Ok(bin.to_path_buf())
        } else {
            Err(format!(
                "--etcd-bin {bin:?} does not exist or is not an executable file"
            ))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(bin))
        .find(|p| executable(p))
        .ok_or_else(|| {
            format!("--etcd-bin {bin:?} was not found on PATH; install etcd or give its full path")
        })
}
