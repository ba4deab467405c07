//! Process-level side effects: replace this process with etcd (so etcd is the container's
//! main process and receives its signals), find the etcd serving a volume, and copy this
//! binary for the copy-in pattern.

use std::os::unix::process::CommandExt;
use std::path::Path;

/// Execs `bin` with `argv`; returns only if the exec failed.
pub fn exec_etcd(bin: &Path, argv: &[String]) -> std::io::Error {
    std::process::Command::new(bin).args(argv).exec()
}

/// Copies the running binary to `dir/etcd-steward` (mode 0755), replacing it atomically.
pub fn install_self(dir: &Path) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe()?;
    std::fs::create_dir_all(dir)?;
    let target = dir.join("etcd-steward");
    let tmp = dir.join(".etcd-steward.tmp");
    std::fs::copy(&me, &tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, &target)?;
    Ok(target)
}

/// The etcd process serving `data_dir`, found in `/proc` by its command line (the binary
/// `init` execs, with `--data-dir` naming this volume).
pub fn find_etcd(data_dir: &Path) -> Option<i32> {
    let want = data_dir.to_string_lossy().trim_end_matches('/').to_string();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if is_etcd_for(&args, &want) {
            return Some(pid);
        }
    }
    None
}

/// Whether `args` is etcd's command line for data directory `want` (and not
/// etcd-steward's, which takes `--data-dir` too).
pub fn is_etcd_for(args: &[String], want: &str) -> bool {
    let Some(program) = args.first() else {
        return false;
    };
    let base = program.rsplit('/').next().unwrap_or(program);
    if !base.starts_with("etcd") || base.starts_with("etcd-steward") || base.starts_with("etcdctl")
    {
        return false;
    }
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let value = match a.strip_prefix("--data-dir") {
            Some(rest) if rest.starts_with('=') => rest[1..].to_string(),
            Some("") => it.next().cloned().unwrap_or_default(),
            _ => continue,
        };
        if value.trim_end_matches('/') == want {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_is_told_apart_from_etcd_steward_by_its_program() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(is_etcd_for(
            &args(&[
                "/usr/local/bin/etcd",
                "--name=etcd-0",
                "--data-dir=/var/lib/etcd/"
            ]),
            "/var/lib/etcd"
        ));
        assert!(is_etcd_for(
            &args(&["etcd", "--data-dir", "/var/lib/etcd"]),
            "/var/lib/etcd"
        ));
        assert!(!is_etcd_for(
            &args(&["etcd", "--data-dir=/var/lib/other"]),
            "/var/lib/etcd"
        ));
        assert!(!is_etcd_for(
            &args(&["/bin/etcd-steward", "sidecar", "--data-dir=/var/lib/etcd"]),
            "/var/lib/etcd"
        ));
    }
}
