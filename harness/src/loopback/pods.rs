//! A pod's processes: started (the agent or a plain etcd), killed, restarted, wiped.

use std::path::PathBuf;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::{host, Kind, PlainStart, Set, SERVICE};
use crate::dns::DOMAIN;
use crate::pki::Pki;
use crate::{procs, Error, Result};

impl Set {
    /// The etcd-steward options of pod `o` (both commands take them).
    pub fn common_args(&self, o: u32) -> Vec<String> {
        let pod = self.pod(o);
        let mut args = vec![
            format!("--name={}", self.member_name(o)),
            format!("--replicas={}", self.replicas),
            format!("--data-dir={}", pod.data_dir.display()),
            format!("--listen-ip={}", pod.ip),
            format!("--dns-server={}", self.dns.addr()),
        ];
        if let Some(t) = &self.stall_timeout {
            args.push(format!("--learner-stall-timeout={t}"));
        }
        args.push(format!("--cluster-domain={DOMAIN}"));
        args.extend(
            self.pki
                .iter()
                .flat_map(Pki::args)
                .map(|a| a.replace("{ordinal}", &o.to_string())),
        );
        args.extend(
            self.control_token
                .iter()
                .map(|t| format!("--control-token-file={}", t.display())),
        );
        // `{ordinal}` in an extra option becomes the pod's ordinal (per-pod paths, as a pod's
        // own emptyDir would be).
        args.extend(
            self.extra_args
                .iter()
                .map(|a| a.replace("{ordinal}", &o.to_string())),
        );
        args
    }

    /// Where the current start of pod `o` logs the output of `what` (`init`, `sidecar`,
    /// `etcd`).
    pub fn log_path(&self, o: u32, what: &str) -> PathBuf {
        let inc = self.pod(o).incarnation.max(1);
        self.root_path.join(format!("pod-{o}/{what}-{inc}.log"))
    }

    fn log_files(&self, o: u32, what: &str) -> Result<(std::fs::File, std::fs::File)> {
        let path = self.log_path(o, what);
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(Error::io(format!("opening {}", path.display())))?;
        let g = f
            .try_clone()
            .map_err(Error::io(format!("opening {}", path.display())))?;
        Ok((f, g))
    }

    fn steward_command(&self, mut cmd: Command, o: u32, what: &str) -> Result<Command> {
        let (out, err) = self.log_files(o, what)?;
        cmd.env("ETCD_STEWARD_LOG", &self.log_filter)
            .env_remove("HOSTNAME")
            .stdout(out)
            .stderr(err);
        Ok(cmd)
    }

    /// Starts pod `o` the way its kind starts: publishes its name, then the agent's
    /// sidecar and init (→ etcd), or a plain etcd forming a new cluster.
    pub fn start(&mut self, o: u32) -> Result<()> {
        self.set_dns(o, true)?;
        match self.kind {
            Kind::Agent => {
                self.start_sidecar(o)?;
                self.start_init(o)
            }
            Kind::Plain => self.start_plain(o, &PlainStart::New),
        }
    }

    /// Starts pod `o`'s sidecar (a new start of the pod: new log files).
    pub fn start_sidecar(&mut self, o: u32) -> Result<()> {
        self.pod_mut(o).incarnation += 1;
        let mut cmd = Command::new(&self.steward);
        let args = self.common_args(o);
        // The pod's etcd, as its container has it (the drill runs it, and the restore tool
        // is looked for beside it), unless the scenario gives its own.
        let etcd_bin = (!args.iter().any(|a| a.starts_with("--etcd-bin"))).then(|| {
            let bin = self.pod(o).etcd_bin.as_ref().unwrap_or(&self.etcd);
            format!("--etcd-bin={}", bin.display())
        });
        cmd.arg("sidecar").args(args).args(etcd_bin);
        let cmd = self.steward_command(cmd, o, "sidecar")?;
        let child = procs::spawn(cmd, &self.steward)?;
        self.join_partitions(o, child.id())?;
        self.pod_mut(o).sidecar = Some(child);
        Ok(())
    }

    /// As [`Self::start`] (an agent's pod), passing `extra_etcd_args` to its etcd.
    pub fn start_with_etcd_args(&mut self, o: u32, extra_etcd_args: &[&str]) -> Result<()> {
        self.set_dns(o, true)?;
        self.start_sidecar(o)?;
        self.start_init_with(o, extra_etcd_args)
    }

    /// Starts pod `o`'s init (→ etcd) in the pod's mount namespace.
    pub fn start_init(&mut self, o: u32) -> Result<()> {
        self.start_init_with(o, &[])
    }

    /// As [`Self::start_init`], passing `extra_etcd_args` to etcd (`init -- ARGS`).
    pub fn start_init_with(&mut self, o: u32, extra_etcd_args: &[&str]) -> Result<()> {
        let mut cmd = procs::in_pod_namespace(&self.root_path.join("resolv.conf"), &self.steward);
        cmd.arg("init")
            .args(self.common_args(o))
            .arg(format!(
                "--etcd-bin={}",
                self.pod(o)
                    .etcd_bin
                    .as_ref()
                    .unwrap_or(&self.etcd)
                    .display()
            ))
            .arg("--")
            .args(extra_etcd_args);
        let cmd = self.steward_command(cmd, o, "init")?;
        let child = procs::spawn(cmd, &self.steward)?;
        self.join_partitions(o, child.id())?;
        self.pod_mut(o).etcd = Some(child);
        Ok(())
    }

    /// The static command line a person would write for member `o`.
    pub fn plain_args(&self, o: u32, start: &PlainStart) -> Vec<String> {
        let pod = self.pod(o);
        let mut args = vec![
            format!("--name={}", self.member_name(o)),
            format!("--data-dir={}", pod.data_dir.display()),
            format!("--listen-peer-urls=http://{}:2380", pod.ip),
            format!("--listen-client-urls=http://{}:2379", pod.ip),
            format!("--initial-advertise-peer-urls={}", self.peer_url(o)),
            format!("--advertise-client-urls=http://{}:2379", self.host(o)),
        ];
        match start {
            PlainStart::New => {
                let cluster: Vec<String> = (0..self.replicas)
                    .map(|p| format!("{}={}", self.member_name(p), self.peer_url(p)))
                    .collect();
                args.push(format!("--initial-cluster={}", cluster.join(",")));
                args.push("--initial-cluster-state=new".into());
                args.push(format!("--initial-cluster-token={}", self.token));
            }
            PlainStart::Existing(cluster) => {
                args.push(format!("--initial-cluster={cluster}"));
                args.push("--initial-cluster-state=existing".into());
            }
        }
        args
    }

    /// Starts a plain etcd for pod `o` (a new start of the pod).
    pub fn start_plain(&mut self, o: u32, start: &PlainStart) -> Result<()> {
        self.start_plain_with(o, start, &[])
    }

    /// As [`Self::start_plain`], with more etcd flags (e.g. `--force-new-cluster`).
    pub fn start_plain_with(&mut self, o: u32, start: &PlainStart, extra: &[&str]) -> Result<()> {
        self.pod_mut(o).incarnation += 1;
        let mut cmd = procs::in_pod_namespace(&self.root_path.join("resolv.conf"), &self.etcd);
        cmd.args(self.plain_args(o, start)).args(extra);
        let (out, err) = self.log_files(o, "etcd")?;
        cmd.stdout(out).stderr(err);
        let child = procs::spawn(cmd, &self.etcd)?;
        self.join_partitions(o, child.id())?;
        self.pod_mut(o).etcd = Some(child);
        Ok(())
    }

    /// Turns an agent set into a plain one on the same data: every pod is killed and its
    /// etcd started again by hand with the static command line (etcd ignores the
    /// initial-cluster flags on a data directory that holds its WAL).
    pub async fn become_plain(&mut self) -> Result<()> {
        for o in 0..self.replicas {
            self.kill_processes(o).await;
        }
        self.kind = Kind::Plain;
        for o in 0..self.replicas {
            self.start_plain(o, &PlainStart::New)?;
        }
        Ok(())
    }

    /// Turns a plain set back into an agent one on the same data: every pod is killed and
    /// started again with the agent (sidecar + init, which finds its data and execs etcd).
    pub async fn become_agent(&mut self) -> Result<()> {
        for o in 0..self.replicas {
            self.kill_processes(o).await;
        }
        self.kind = Kind::Agent;
        for o in 0..self.replicas {
            self.start(o)?;
        }
        Ok(())
    }

    /// The pid of the pod's etcd (or of init before it execs etcd).
    pub fn etcd_pid(&self, o: u32) -> Option<u32> {
        self.pod(o).etcd.as_ref().and_then(Child::id)
    }

    /// The pid of the pod's sidecar.
    pub fn sidecar_pid(&self, o: u32) -> Option<u32> {
        self.pod(o).sidecar.as_ref().and_then(Child::id)
    }

    /// SIGKILLs the pod's etcd (or waiting init) and sidecar and withdraws its DNS name:
    /// the pod is gone.
    pub async fn kill(&mut self, o: u32) -> Result<()> {
        self.kill_processes(o).await;
        self.set_dns(o, false)
    }

    /// SIGKILLs the pod's etcd (or init) and sidecar; its name stays published.
    pub async fn kill_processes(&mut self, o: u32) {
        self.kill_etcd(o).await;
        self.kill_sidecar(o).await;
    }

    /// SIGKILLs only the sidecar.
    pub async fn kill_sidecar(&mut self, o: u32) {
        if let Some(mut c) = self.pod_mut(o).sidecar.take() {
            let _ = c.kill().await;
        }
    }

    /// SIGKILLs only the etcd container's process (init or etcd).
    pub async fn kill_etcd(&mut self, o: u32) {
        let url = self.client_url(o);
        self.clients.forget(&url);
        if let Some(mut c) = self.pod_mut(o).etcd.take() {
            let _ = c.kill().await;
        }
    }

    /// The volume is lost: the data directory emptied, as a new volume is mounted empty
    /// (the directory itself stays: it may be a mount point, see [`Set::limit_volumes`]).
    pub fn wipe(&mut self, o: u32) -> Result<()> {
        let dir = self.pod(o).data_dir.clone();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(format!("reading {}", dir.display()))(e)),
        };
        for e in entries.filter_map(std::result::Result::ok) {
            let path = e.path();
            let r = match e.file_type().map(|t| t.is_dir()) {
                Ok(true) => std::fs::remove_dir_all(&path),
                _ => std::fs::remove_file(&path),
            };
            r.map_err(Error::io(format!("removing {}", path.display())))?;
        }
        Ok(())
    }

    /// What kubelet does for a container whose process exited: starts it again. For every
    /// pod whose etcd container (init → etcd) was started and has exited since, starts
    /// init again; returns those pods. Tests that need restarts (a recovery stops etcd so
    /// that it starts again forced) call this in their wait loops.
    pub fn restart_exited(&mut self) -> Result<Vec<u32>> {
        let mut restarted = Vec::new();
        if !matches!(self.kind, Kind::Agent) {
            return Ok(restarted);
        }
        for o in 0..self.pods.len() as u32 {
            let exited = match self.pod_mut(o).etcd.as_mut() {
                Some(c) => !matches!(c.try_wait(), Ok(None)),
                None => false,
            };
            if exited {
                let url = self.client_url(o);
                self.clients.forget(&url);
                self.pod_mut(o).etcd = None;
                self.start_init(o)?;
                restarted.push(o);
            }
        }
        Ok(restarted)
    }

    /// `etcd-steward ARGS` with pod `o`'s options, as `kubectl exec` runs it in that pod.
    pub async fn steward(&self, o: u32, args: &[&str]) -> std::process::Output {
        self.steward_in(o, args)
            .output()
            .await
            .unwrap_or_else(|e| panic!("running {}: {e}", self.steward.display()))
    }

    /// The command [`Self::steward`] runs, to start it in the background.
    pub fn steward_in(&self, o: u32, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.steward);
        cmd.args(args)
            .args(self.common_args(o))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        cmd
    }

    /// Runs `cmd` to its end while restarting exited etcd containers, as kubelet would
    /// meanwhile (a recovery or restore stops etcd so that it starts again).
    pub async fn run_restarting(&mut self, mut cmd: Command) -> std::process::Output {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        let run = tokio::spawn(child.wait_with_output());
        while !run.is_finished() {
            if let Err(e) = self.restart_exited() {
                panic!("restarting an exited etcd container: {e}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match run.await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => panic!("waiting for {cmd:?}: {e}"),
            Err(e) => panic!("waiting for {cmd:?}: {e}"),
        }
    }

    /// Whether pod `o`'s sidecar process is still running.
    pub fn sidecar_running(&mut self, o: u32) -> bool {
        match self.pod_mut(o).sidecar.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// A new set of certificates for this set's names from new CAs, valid until `until`
    /// (year, month, day), in `<root>/<name>` (install its files with [`Pki::replace_from`]).
    pub fn renewed_pki(&self, name: &str, until: (i32, u8, u8)) -> Result<Pki> {
        Pki::generate_until(
            &self.root_path.join(name),
            SERVICE,
            "default",
            DOMAIN,
            Some(until),
        )
    }

    /// The pods issue their own certificates from CAs the set makes now
    /// ([`Pki::generate_issuer`], `--tls-issuer-dir`), instead of the set's shared files; the
    /// harness's clients use a client certificate of the same CA. Before any pod starts.
    pub fn issue_own_certificates(&mut self) -> Result<()> {
        let pki = Pki::generate_issuer(
            &self.root_path.join("pki-issuer"),
            SERVICE,
            "default",
            DOMAIN,
        )?;
        self.pki = Some(pki);
        self.reload_client_tls()
    }

    /// The harness's own etcd clients connect with the certificates the set's files hold now
    /// (after they were replaced).
    pub fn reload_client_tls(&mut self) -> Result<()> {
        let tls = match &self.pki {
            Some(pki) => Some(pki.client_tls(&host(0))?),
            None => None,
        };
        self.clients.set_tls(tls);
        Ok(())
    }

    /// Whether the etcd container's process (init or etcd) is still running.
    pub fn init_running(&mut self, o: u32) -> bool {
        match self.pod_mut(o).etcd.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills everything and waits for the processes; the directory goes unless kept.
    pub async fn shutdown(&mut self) {
        let ordinals: Vec<u32> = self.pods.iter().map(|p| p.ordinal).collect();
        for o in ordinals {
            self.kill_processes(o).await;
        }
        self.dns.stop().await;
        self.finished = true;
    }
}
