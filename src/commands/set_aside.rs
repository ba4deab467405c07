//! `etcd-steward set-aside [--list] | --remove NAME [--yes]`, run in a pod's etcd container
//! (whose data volume is writable): the copies `init`, `leave`, restores and recoveries set
//! aside on this volume rather than delete ([`crate::volume::aside`]), each with why, the
//! sentence the journal gave, size and age; and, only when an operator names one and says
//! `--yes`, that one removed. Nothing else ever removes them.

use std::path::Path;

use serde_json::json;

use crate::volume::aside::{self, Copy};
use crate::volume::VolumeError;

/// How `set-aside` ended.
pub enum Ended {
    Listed,
    /// `--remove` without `--yes`: what would go, and nothing changed.
    Planned,
    Removed,
    Refused(String),
}

/// The list as text: one line per copy, oldest first, and the total.
pub fn render(copies: &[Copy], now: u64) -> String {
    if copies.is_empty() {
        return "no copies under set-aside/\n".into();
    }
    let mut out = String::new();
    let mut total = 0;
    for c in copies {
        total += c.bytes;
        out.push_str(&format!(
            "{:<40} {:>10}  {:<12} {}{}\n",
            c.name,
            crate::units::mib_or_gib(i64::try_from(c.bytes).ok()),
            c.at_unix
                .map_or("?".into(), |at| crate::units::ago(at, now)),
            c.reason.as_deref().unwrap_or(&c.why),
            if c.holds_wal { "" } else { " (no WAL)" },
        ));
    }
    out.push_str(&format!(
        "{} copies, {} in all; remove one with `etcd-steward set-aside --remove NAME` (the plan), then `--yes`\n",
        copies.len(),
        crate::units::mib_or_gib(i64::try_from(total).ok())
    ));
    out
}

/// Runs the command on the data directory `dir`, printing on stdout.
pub fn run(
    dir: &Path,
    remove: Option<&str>,
    yes: bool,
    json_out: bool,
    now: u64,
) -> Result<Ended, VolumeError> {
    let copies = aside::list(dir)?;
    let Some(name) = remove else {
        if json_out {
            println!("{}", serde_json::to_string(&copies).unwrap_or_default());
        } else {
            print!("{}", render(&copies, now));
        }
        return Ok(Ended::Listed);
    };
    // With --yes, `remove` checks the name itself (and finishes a removal killed midway).
    if let (Err(why), false) = (aside::check_name(&copies, name), yes) {
        return Ok(Ended::Refused(why));
    }
    let copy = copies.iter().find(|c| c.name == name);
    let only_data = copy.is_some_and(|c| c.holds_wal)
        && !crate::volume::has_data(dir)?
        && copies.iter().filter(|c| c.holds_wal).count() == 1;
    let plan = json!({
        "remove": dir.join("set-aside").join(name),
        "copy": copy,
        "warning": only_data.then_some(
            "this volume holds no other etcd data: this copy is the only one here (a member \
             that left, a recovery's survivor before it was forced); make sure the cluster \
             does not need it"
        ),
    });
    if !yes {
        println!("{plan}");
        return Ok(Ended::Planned);
    }
    match aside::remove(dir, name)? {
        Ok(path) => {
            tracing::warn!(
                path = %path.display(),
                "set-aside copy removed, as the operator asked (etcd-steward set-aside --remove --yes)"
            );
            println!("{}", json!({"removed": path}));
            Ok(Ended::Removed)
        }
        Err(why) => Ok(Ended::Refused(why)),
    }
}
