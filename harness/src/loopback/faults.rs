//! Network partitions and full disks (randomized fault schedules).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use super::Set;
use crate::{Error, Result};

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` or, on a hybrid host,
/// `/sys/fs/cgroup/unified`).
fn cgroup2_root() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts")
        .map_err(Error::io("reading /proc/mounts for the cgroup2 mount"))?;
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
        })
        .next()
        .ok_or_else(|| {
            Error::Failed("no cgroup2 mount in /proc/mounts (partitions need one)".into())
        })
}

fn run_tool(program: &str, args: &[&str]) -> Result<()> {
    let what = format!("{program} {}", args.join(" "));
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(Error::io(what.clone()))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(Error::Failed(format!(
            "{what}: {} ({})",
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        ))),
    }
}

/// Cuts pods of one set from each other on loopback while clients still reach them.
///
/// Every packet between loopback pods leaves from 127.0.0.1, so a pod is recognised by its
/// processes instead: each pod's processes live in a cgroup of their own
/// (`<cgroup2>/steward-chaos-<net>/pod-<o>`), and a mangle rule marks every connection a
/// pod opens with the pod's mark. A cut pod's connections to another pod's address, and
/// other pods' connections to its address, are dropped (both directions, established ones
/// too); the writer's and the harness's connections carry no mark and pass. The rules live
/// in chains `STEWARD-CHAOS-<net>` (filter and mangle) jumped from OUTPUT (every loopback
/// packet passes it); they are removed when this is dropped, even when a test panics.
pub struct Partitions {
    net: u8,
    chain: String,
    cgroup: PathBuf,
    pods: Vec<(u32, Ipv4Addr)>,
    cut: BTreeSet<u32>,
}

impl Partitions {
    fn mark(&self, o: u32) -> String {
        format!(
            "0x{:x}",
            (0x5cu32 << 24) | (u32::from(self.net) << 8) | (o + 1)
        )
    }

    fn pod_cgroup(&self, o: u32) -> PathBuf {
        self.cgroup.join(format!("pod-{o}"))
    }

    /// Removes the chains (and any jump to them) of `chain` from both tables.
    fn remove_chains(chain: &str) {
        for table in ["filter", "mangle"] {
            while run_tool(
                "iptables",
                &["-w", "-t", table, "-D", "OUTPUT", "-j", chain],
            )
            .is_ok()
            {}
            let _ = run_tool("iptables", &["-w", "-t", table, "-F", chain]);
            let _ = run_tool("iptables", &["-w", "-t", table, "-X", chain]);
        }
    }

    fn new(net: u8, pods: Vec<(u32, Ipv4Addr)>) -> Result<Partitions> {
        let chain = format!("STEWARD-CHAOS-{net}");
        let p = Partitions {
            net,
            cgroup: cgroup2_root()?.join(format!("steward-chaos-{net}")),
            chain,
            pods,
            cut: BTreeSet::new(),
        };
        // Whatever an earlier run on this network left behind goes first.
        Partitions::remove_chains(&p.chain);
        for table in ["filter", "mangle"] {
            run_tool("iptables", &["-w", "-t", table, "-N", &p.chain])?;
            run_tool(
                "iptables",
                &["-w", "-t", table, "-I", "OUTPUT", "-j", &p.chain],
            )?;
        }
        for (o, _) in &p.pods {
            let dir = p.pod_cgroup(*o);
            std::fs::create_dir_all(&dir)
                .map_err(Error::io(format!("creating cgroup {}", dir.display())))?;
            let path = format!("steward-chaos-{net}/pod-{o}");
            run_tool(
                "iptables",
                &[
                    "-w",
                    "-t",
                    "mangle",
                    "-A",
                    &p.chain,
                    "-m",
                    "cgroup",
                    "--path",
                    &path,
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "NEW",
                    "-j",
                    "CONNMARK",
                    "--set-mark",
                    &p.mark(*o),
                ],
            )?;
        }
        Ok(p)
    }

    /// Puts process `pid` (of pod `o`) in the pod's cgroup.
    fn join(&self, o: u32, pid: u32) -> Result<()> {
        let procs = self.pod_cgroup(o).join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .map_err(Error::io(format!("moving {pid} into {}", procs.display())))
    }

    /// Writes the filter chain for the pods now cut.
    fn apply(&self) -> Result<()> {
        run_tool("iptables", &["-w", "-t", "filter", "-F", &self.chain])?;
        for o in &self.cut {
            let own = self.pods.iter().find(|(p, _)| p == o).map(|(_, ip)| *ip);
            for (p, ip) in self.pods.iter().filter(|(p, _)| p != o) {
                let rules = [(self.mark(*o), ip.to_string())]
                    .into_iter()
                    .chain(own.map(|own| (self.mark(*p), own.to_string())));
                for (mark, to) in rules {
                    run_tool(
                        "iptables",
                        &[
                            "-w",
                            "-t",
                            "filter",
                            "-A",
                            &self.chain,
                            "-m",
                            "connmark",
                            "--mark",
                            &mark,
                            "-m",
                            "conntrack",
                            "--ctorigdst",
                            &to,
                            "-j",
                            "DROP",
                        ],
                    )?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for Partitions {
    fn drop(&mut self) {
        Partitions::remove_chains(&self.chain);
        for (o, _) in &self.pods {
            let _ = std::fs::remove_dir(self.pod_cgroup(*o));
        }
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// Each pod's volume on a tmpfs of its own, so that a disk can be filled (see
/// [`Set::fill_volume`]); unmounted when dropped.
pub struct LimitedVolumes {
    mounted: Vec<PathBuf>,
    pub(super) keep: bool,
}

impl Drop for LimitedVolumes {
    fn drop(&mut self) {
        for dir in &self.mounted {
            match self.keep {
                true => eprintln!(
                    "volume {} left mounted (umount it when done)",
                    dir.display()
                ),
                false => {
                    let _ = run_tool("umount", &["-l", &dir.display().to_string()]);
                }
            }
        }
    }
}

/// The file [`Set::fill_volume`] fills a volume with.
pub const FILL_FILE: &str = ".harness-fill";

impl Set {
    /// Makes partitions possible ([`Partitions`]): needs root, iptables and cgroup v2.
    /// Pods already running join their cgroups; every pod started from now on too.
    pub fn enable_partitions(&mut self) -> Result<()> {
        let pods = self.pods.iter().map(|p| (p.ordinal, p.ip)).collect();
        self.partitions = Some(Partitions::new(self.net, pods)?);
        for o in self.pods.iter().map(|p| p.ordinal).collect::<Vec<_>>() {
            self.join_partitions(o, self.etcd_pid(o))?;
            self.join_partitions(o, self.sidecar_pid(o))?;
        }
        Ok(())
    }

    pub(super) fn join_partitions(&self, o: u32, pid: Option<u32>) -> Result<()> {
        match (&self.partitions, pid) {
            (Some(p), Some(pid)) => p.join(o, pid),
            _ => Ok(()),
        }
    }

    /// Cuts pod `o` from the other pods (both directions; clients still reach it), or heals
    /// the cut. [`Set::enable_partitions`] must have been called.
    pub fn partition(&mut self, o: u32, cut: bool) -> Result<()> {
        let Some(p) = self.partitions.as_mut() else {
            return Err(Error::Failed(format!(
                "cutting pod {o} off: call enable_partitions first"
            )));
        };
        match cut {
            true => p.cut.insert(o),
            false => p.cut.remove(&o),
        };
        p.apply()
    }

    /// Puts every pod's volume on a tmpfs of `mib` MiB (before any pod starts: each pod's
    /// mount namespace is a copy of the host's at its start).
    pub fn limit_volumes(&mut self, mib: u32) -> Result<()> {
        let mut v = LimitedVolumes {
            mounted: Vec::new(),
            keep: false,
        };
        for dir in self
            .pods
            .iter()
            .map(|p| p.data_dir.clone())
            .collect::<Vec<_>>()
        {
            std::fs::create_dir_all(&dir)
                .map_err(Error::io(format!("creating {}", dir.display())))?;
            let opts = format!("size={mib}m,mode=0700");
            run_tool(
                "mount",
                &[
                    "-t",
                    "tmpfs",
                    "-o",
                    &opts,
                    "tmpfs",
                    &dir.display().to_string(),
                ],
            )?;
            v.mounted.push(dir);
        }
        self.volumes = Some(v);
        Ok(())
    }

    /// Fills pod `o`'s volume (see [`Set::limit_volumes`]) with [`FILL_FILE`] until no space
    /// is left: etcd's next write that needs space fails with ENOSPC. Returns the bytes
    /// written.
    pub fn fill_volume(&self, o: u32) -> Result<u64> {
        use std::io::Write as _;
        if self.volumes.is_none() {
            return Err(Error::Failed(format!(
                "filling pod {o}'s volume, which is not size-limited: call limit_volumes before the pods start"
            )));
        }
        let path = self.data_dir(o).join(FILL_FILE);
        let mut f = std::fs::File::create(&path)
            .map_err(Error::io(format!("creating {}", path.display())))?;
        let chunk = vec![0u8; 1 << 20];
        let mut written = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => return Err(Error::io(format!("filling {}", path.display()))(e)),
            }
        }
        let _ = f.sync_all();
        Ok(written)
    }

    /// Frees what [`Set::fill_volume`] took.
    pub fn free_volume(&self, o: u32) -> Result<()> {
        let path = self.data_dir(o).join(FILL_FILE);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", path.display()))(e)),
        }
    }
}
