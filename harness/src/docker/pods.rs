//! A pod's containers: their options, created, started, killed, stopped, removed, cut off;
//! backups.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Stdio;

use tokio::process::Command;

use super::cli::{docker, etcd_3_4_mounts, labels, must};
use super::{
    image, Cluster, BACKUP_MOUNT, CONTROL_MOUNT, ETCD_3_4_IN_POD, PEER_TLS_MOUNT, SERVICE_HOST,
};
use crate::Etcd;

impl Cluster {
    fn common_args(&self, o: u32) -> Vec<String> {
        let mut args = vec![
            format!("--name=etcd-{o}"),
            format!("--replicas={}", self.replicas),
            "--listen-ip=0.0.0.0".to_string(),
        ];
        if let Some(t) = &self.stall_timeout {
            args.push(format!("--learner-stall-timeout={t}"));
        }
        args.push(format!("--control-token-file={CONTROL_MOUNT}/token"));
        args.extend(self.extra_args.iter().cloned());
        if self.peer_tls.is_some() {
            for (opt, file) in [
                ("--peer-cert-file", "peer.pem"),
                ("--peer-key-file", "peer-key.pem"),
                ("--peer-trusted-ca-file", "peer-ca.pem"),
            ] {
                args.push(format!("{opt}={PEER_TLS_MOUNT}/{file}"));
            }
        }
        args
    }

    /// `-v` options that mount the control token (read-only).
    fn control_args(&self) -> Vec<String> {
        vec![
            "-v".into(),
            format!("{}:{CONTROL_MOUNT}:ro", self.control.display()),
        ]
    }

    /// `-v` options that mount the peer certificates (read-only), once enabled.
    fn peer_tls_args(&self) -> Vec<String> {
        match &self.peer_tls {
            Some(dir) => vec![
                "-v".into(),
                format!("{}:{PEER_TLS_MOUNT}:ro", dir.display()),
            ],
            None => Vec::new(),
        }
    }

    /// `-e`/`-v` options that give a container the backup store (`file://` on a volume
    /// mounted at [`BACKUP_MOUNT`]; read-only for init, which only restores from it).
    fn backup_args(&self, writable: bool) -> Vec<String> {
        let Some(vol) = &self.backups else {
            return Vec::new();
        };
        let mode = if writable { "rw" } else { "ro" };
        vec![
            "-e".into(),
            format!("ETCD_STEWARD_BACKUP_URL=file://{BACKUP_MOUNT}"),
            "-e".into(),
            format!("ETCD_STEWARD_BACKUP_INTERVAL={}", self.backup_interval),
            "-e".into(),
            "ETCD_STEWARD_BACKUP_SCRATCH_DIR=/tmp/backup-scratch".into(),
            "-v".into(),
            format!("{vol}:{BACKUP_MOUNT}:{mode}"),
        ]
    }

    fn security_args(&self) -> Vec<String> {
        [
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--user",
            "65532:65532",
            "--tmpfs",
            "/tmp",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(labels(&self.run))
        .collect()
    }

    /// Creates a pod's volume (if missing) and its etcd container, without starting it.
    pub async fn create_etcd_container(&mut self, o: u32, etcd: Etcd) {
        self.create_etcd_container_with(o, etcd, &[]).await;
    }

    /// As [`Self::create_etcd_container`], passing `etcd_args` to etcd (`init -- ARGS`).
    pub async fn create_etcd_container_with(&mut self, o: u32, etcd: Etcd, etcd_args: &[&str]) {
        assert!(
            !etcd.tls() && etcd != Etcd::V3_5Current,
            "Docker pods run the image's etcd 3.5 or the host's 3.4; {etcd:?} is a loopback set's"
        );
        if etcd == Etcd::V3_4 && self.mounts_3_4.is_empty() {
            self.mounts_3_4 = etcd_3_4_mounts().await;
        }
        self.pods.insert(o);
        let vol = self.volume(o);
        if docker(&["volume", "inspect", &vol]).await.is_err() {
            let mut args = vec!["volume".to_string(), "create".to_string()];
            args.extend(labels(&self.run));
            args.push(vol.clone());
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            must(&refs).await;
        }
        let cluster_ip = self.fresh_cluster_ip(o);
        let mut args: Vec<String> = vec![
            "create".into(),
            "--name".into(),
            self.etcd_ctr(o),
            "--hostname".into(),
            format!("etcd-{o}"),
            "--network".into(),
            self.net.clone(),
            "--ip".into(),
            cluster_ip.to_string(),
            "--network-alias".into(),
            self.host(o),
            "-e".into(),
            "ETCD_STEWARD_LOG=info".into(),
            "-v".into(),
            format!("{vol}:/var/lib/etcd"),
        ];
        args.extend(self.backup_args(false));
        args.extend(self.control_args());
        args.extend(self.peer_tls_args());
        if self.peer_tls.is_some() {
            // The headless Service's name, resolving to every pod: etcd checks that a peer's
            // client certificate names the address it connects from, by an IP or by a DNS
            // name that resolves to it (a wildcard resolves to nothing).
            args.extend(["--network-alias".into(), SERVICE_HOST.into()]);
        }
        args.extend(self.security_args());
        if etcd == Etcd::V3_4 {
            for m in &self.mounts_3_4 {
                args.push("-v".into());
                args.push(m.clone());
            }
        }
        args.push(image());
        args.push("etcd-steward".into());
        args.push("init".into());
        args.extend(self.common_args(o));
        if etcd == Etcd::V3_4 {
            args.push(format!("--etcd-bin={ETCD_3_4_IN_POD}"));
        }
        if !etcd_args.is_empty() {
            args.push("--".into());
            args.extend(etcd_args.iter().map(|a| a.to_string()));
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        must(&refs).await;
        let ip = self.ip(o).to_string();
        must(&[
            "network",
            "connect",
            "--ip",
            &ip,
            &self.mgmt,
            &self.etcd_ctr(o),
        ])
        .await;
    }

    /// Creates and starts a whole pod (volume kept if it exists).
    pub async fn create_pod(&mut self, o: u32, etcd: Etcd) {
        self.create_pod_with(o, etcd, &[]).await;
    }

    /// As [`Self::create_pod`], passing `etcd_args` to etcd.
    pub async fn create_pod_with(&mut self, o: u32, etcd: Etcd, etcd_args: &[&str]) {
        self.create_etcd_container_with(o, etcd, etcd_args).await;
        must(&["start", &self.etcd_ctr(o)]).await;
        if let Err(e) = self.run_sidecar(o).await {
            // Only a pod whose etcd container already exited (a misconfigured etcd) may
            // lack its sidecar: there is no network namespace left to join.
            assert!(
                !self.running(&self.etcd_ctr(o)).await,
                "pod {o}'s sidecar did not start: {e}"
            );
            self.say(&format!(
                "pod {o}: its etcd container exited before the sidecar could join it"
            ));
        }
        self.say(&format!("pod {o} created and started ({etcd:?})"));
    }

    async fn run_sidecar(&self, o: u32) -> Result<String, String> {
        let mut args: Vec<String> = vec![
            "run".into(),
            "-d".into(),
            "--name".into(),
            self.steward_ctr(o),
            "--network".into(),
            format!("container:{}", self.etcd_ctr(o)),
            // The pod's process namespace, shared as in the manifests: the sidecar stops
            // etcd once for a recovery.
            "--pid".into(),
            format!("container:{}", self.etcd_ctr(o)),
            "-e".into(),
            "ETCD_STEWARD_LOG=info".into(),
            "-v".into(),
            format!("{}:/var/lib/etcd:ro", self.volume(o)),
        ];
        args.extend(self.backup_args(true));
        args.extend(self.control_args());
        args.extend(self.peer_tls_args());
        args.extend(self.security_args());
        args.push(image());
        args.push("etcd-steward".into());
        args.push("sidecar".into());
        args.extend(self.common_args(o));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&refs).await
    }

    /// Starts a stopped pod: its etcd container, then the sidecar in its (new) namespace.
    pub async fn start(&self, o: u32) {
        must(&["start", &self.etcd_ctr(o)]).await;
        must(&["start", &self.steward_ctr(o)]).await;
        self.say(&format!("pod {o} started"));
    }

    /// What kubelet does for a container whose process exited: for every pod whose etcd
    /// container stopped by itself, starts it again, and restarts its sidecar, whose
    /// network and process namespaces were that container's. Returns those pods.
    pub async fn restart_exited(&self) -> Vec<u32> {
        let mut restarted = Vec::new();
        for o in self.ordinals() {
            let ctr = self.etcd_ctr(o);
            let exited = docker(&["inspect", "-f", "{{.State.Status}}", &ctr])
                .await
                .is_ok_and(|s| s == "exited");
            if exited && docker(&["start", &ctr]).await.is_ok() {
                let _ = docker(&["restart", "-t", "2", &self.steward_ctr(o)]).await;
                self.say(&format!(
                    "pod {o}: etcd container exited; restarted (as kubelet does)"
                ));
                restarted.push(o);
            }
        }
        restarted
    }

    /// `etcd-steward ARGS` run in pod `o`'s etcd container with the pod's options (what
    /// `kubectl exec etcd-o -c etcd -- etcd-steward ARGS` does): (exit code, stdout, stderr).
    pub async fn exec_steward(&self, o: u32, args: &[&str]) -> (i32, String, String) {
        self.exec_steward_in(&self.etcd_ctr(o), o, args).await
    }

    /// As [`Self::exec_steward`], in the pod's sidecar container (which holds the backup
    /// store writable: `kubectl exec etcd-o -c steward -- etcd-steward backup`).
    pub async fn exec_sidecar_steward(&self, o: u32, args: &[&str]) -> (i32, String, String) {
        self.exec_steward_in(&self.steward_ctr(o), o, args).await
    }

    async fn exec_steward_in(&self, ctr: &str, o: u32, args: &[&str]) -> (i32, String, String) {
        let mut cmd = tokio::process::Command::new("docker");
        cmd.args(["exec", ctr, "etcd-steward"])
            .args(args)
            .args(self.common_args(o));
        let out = cmd
            .output()
            .await
            .unwrap_or_else(|e| panic!("docker exec: {e}"));
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let r = (
            out.status.code().unwrap_or(-1),
            text(&out.stdout),
            text(&out.stderr),
        );
        self.say(&format!(
            "pod {o}: etcd-steward {} → {}",
            args.join(" "),
            r.0
        ));
        r
    }

    /// SIGKILLs the pod's containers (etcd first: the pod's etcd container is what dies).
    pub async fn kill(&self, o: u32) {
        for c in [self.etcd_ctr(o), self.steward_ctr(o)] {
            if let Err(e) = docker(&["kill", &c]).await {
                assert!(e.contains("is not running"), "{e}");
            }
        }
        self.say(&format!("pod {o} killed"));
    }

    /// Stops the pod gracefully (SIGTERM, then SIGKILL after 10 s), both containers at once.
    pub async fn stop(&self, o: u32) {
        must(&["stop", "-t", "10", &self.etcd_ctr(o), &self.steward_ctr(o)]).await;
        self.say(&format!("pod {o} stopped"));
    }

    /// Removes the pod's containers; with `wipe`, its volume too (the PVC is gone).
    pub async fn remove(&mut self, o: u32, wipe: bool) {
        let _ = docker(&["rm", "-f", &self.steward_ctr(o), &self.etcd_ctr(o)]).await;
        if wipe {
            must(&["volume", "rm", &self.volume(o)]).await;
        }
        self.pods.remove(&o);
        self.say(&format!(
            "pod {o} removed{}",
            if wipe { " with its volume" } else { "" }
        ));
    }

    /// Cuts the pod off the cluster network (it keeps the management network).
    pub async fn partition(&self, o: u32) {
        must(&["network", "disconnect", &self.net, &self.etcd_ctr(o)]).await;
        self.say(&format!("pod {o} partitioned from the cluster network"));
    }

    /// Reconnects it, with its DNS name and its own address.
    pub async fn heal(&self, o: u32) {
        let host = self.host(o);
        let ctr = self.etcd_ctr(o);
        let mut args = vec!["network", "connect", "--alias", host.as_str()];
        let ip = self.cluster_ips.get(&o).map(Ipv4Addr::to_string);
        if let Some(ip) = &ip {
            args.extend(["--ip", ip.as_str()]);
        }
        args.extend([self.net.as_str(), ctr.as_str()]);
        must(&args).await;
        self.say(&format!("pod {o} reconnected to the cluster network"));
    }

    /// A cluster-network address for pod `o`'s new container that no other pod holds, and
    /// not the one its earlier container had.
    fn fresh_cluster_ip(&mut self, o: u32) -> Ipv4Addr {
        let held: BTreeSet<Ipv4Addr> = self.cluster_ips.values().copied().collect();
        loop {
            let ip = Ipv4Addr::new(10, 213, self.net_octet, self.next_host);
            self.next_host = if self.next_host >= 249 {
                10
            } else {
                self.next_host + 1
            };
            if !held.contains(&ip) {
                self.cluster_ips.insert(o, ip);
                return ip;
            }
        }
    }

    /// The paths under `dir` of pod `o`'s volume (relative to the data directory, as
    /// `tar -t` lists them: `dir/`, `dir/a/`, `dir/a/f`), copied out of its etcd container
    /// (running or not); empty when `dir` does not exist.
    pub async fn volume_paths(&self, o: u32, dir: &str) -> Vec<String> {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "docker cp '{}:/var/lib/etcd/{dir}' - | tar -t",
                self.etcd_ctr(o)
            ))
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap_or_else(|e| panic!("cannot run docker cp | tar -t: {e}"));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Whether a container runs.
    pub async fn running(&self, container: &str) -> bool {
        docker(&["inspect", "-f", "{{.State.Running}}", container])
            .await
            .map(|s| s == "true")
            .unwrap_or(false)
    }

    // ---- backups -----------------------------------------------------------------------

    /// Gives every pod created from now on a `file://` backup store, as
    /// manifests/overlays/backup-file does: a volume of the run's (`<run>-backups`) mounted at
    /// [`BACKUP_MOUNT`], writable by the sidecar and read-only for init.
    pub async fn enable_backups(&mut self) {
        let vol = format!("{}-backups", self.run);
        let mut args = vec!["volume".to_string(), "create".to_string()];
        args.extend(labels(&self.run));
        args.push(vol.clone());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        must(&refs).await;
        // A new volume is empty and root's. Mounted once where the image has a directory of
        // the agent's user (/var/lib/etcd), Docker gives it that directory's owner.
        let mut args: Vec<String> = vec![
            "run".into(),
            "--rm".into(),
            "--network".into(),
            "none".into(),
        ];
        args.extend(self.security_args());
        args.extend(["-v".into(), format!("{vol}:/var/lib/etcd"), image()]);
        args.extend(["etcd-steward".into(), "--version".into()]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        must(&refs).await;
        self.backups = Some(vol.clone());
        self.say(&format!(
            "backup store: volume {vol} at file://{BACKUP_MOUNT}"
        ));
    }

    /// Gives every pod created from now on peer TLS (`--peer-cert-file`, … with mutual TLS),
    /// as a StatefulSet rolled with the peer certificates mounted does: certificates for
    /// `*.etcd.default.svc.cluster.local` from a new peer CA, in a host directory mounted
    /// read-only at [`PEER_TLS_MOUNT`]. Pods created before keep talking plain HTTP.
    pub fn enable_peer_tls(&mut self) {
        let dir = std::env::temp_dir().join(format!("{}-peer-tls", self.run));
        crate::pki::Pki::generate(&dir, "etcd", "default", "cluster.local")
            .unwrap_or_else(|e| panic!("peer certificates in {}: {e}", dir.display()));
        self.say(&format!(
            "peer TLS for pods created from now on ({})",
            dir.display()
        ));
        self.peer_tls = Some(dir);
    }

    /// `etcd-steward backup` in pod `o`'s sidecar container: one snapshot now through its
    /// member, uploaded and checked; the manifest it printed.
    pub async fn backup_now(&self, o: u32) -> serde_json::Value {
        let ctr = self.steward_ctr(o);
        let mut args: Vec<String> =
            vec!["exec".into(), ctr, "etcd-steward".into(), "backup".into()];
        args.extend(self.common_args(o));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = must(&refs).await;
        let manifest: serde_json::Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("`backup` printed no JSON manifest ({e}): {out}"));
        self.say(&format!("backup through pod {o}: {out}"));
        manifest
    }

    /// `etcd-steward backup --list` in a throw-away container on the store's volume (no
    /// pod needed, so it works with every pod gone): one object per snapshot, newest first.
    pub async fn backup_list(&self) -> Vec<serde_json::Value> {
        assert!(self.backups.is_some(), "backup_list before enable_backups");
        let mut args: Vec<String> = vec![
            "run".into(),
            "--rm".into(),
            "--network".into(),
            "none".into(),
        ];
        args.extend(self.backup_args(false));
        args.extend(self.control_args());
        args.extend(self.security_args());
        args.extend([
            image(),
            "etcd-steward".into(),
            "backup".into(),
            "--list".into(),
        ]);
        args.extend(self.common_args(0));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = must(&refs).await;
        out.lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| {
                    panic!("`backup --list` printed a line that is not JSON ({e}): {l}")
                })
            })
            .collect()
    }
}
