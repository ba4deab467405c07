//! Process-level side effects: replace this process with etcd (so etcd is the container's
//! main process and receives its signals), and copy this binary for the copy-in pattern.

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
