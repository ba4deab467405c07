//! The scratch etcd's leases during a replay: granted with their archived ID and TTL
//! before a put names them, and every one kept alive until the replay ends (an expiring
//! lease would delete keys and add revisions).

use std::collections::HashSet;
use std::time::Duration;

use etcd_client::{Client, LeaseGrantOptions};

use super::{scratch_err, ReplayError, CALL_TIMEOUT};

/// How often every lease of the scratch etcd is kept alive (etcd's shortest TTL is 3 s
/// with its default timings).
const KEEP_ALIVE_EVERY: Duration = Duration::from_millis(1000);

/// The scratch etcd's leases: the ones known to exist, and a task keeping each alive.
pub(super) struct Leases {
    client: Client,
    pub(super) known: HashSet<i64>,
    add: tokio::sync::mpsc::UnboundedSender<i64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Leases {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Leases {
    /// Keeps every lease the snapshot holds alive from now on.
    pub(super) async fn start(mut client: Client) -> Result<Leases, ReplayError> {
        let listed = client
            .leases()
            .await
            .map_err(|e| scratch_err(format!("cannot list its leases: {e}")))?;
        let (add, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(keep_alive(client.clone(), rx));
        let mut leases = Leases {
            client,
            known: HashSet::new(),
            add,
            task,
        };
        for l in listed.leases() {
            leases.kept(l.id());
        }
        Ok(leases)
    }

    fn kept(&mut self, id: i64) {
        if self.known.insert(id) {
            let _ = self.add.send(id);
        }
    }

    /// Grants lease `id` with `ttl` seconds (before revision `revision` names it).
    pub(super) async fn grant(
        &mut self,
        id: i64,
        ttl: i64,
        revision: i64,
    ) -> Result<(), ReplayError> {
        let options = LeaseGrantOptions::new().with_id(id);
        let answer =
            tokio::time::timeout(CALL_TIMEOUT, self.client.lease_grant(ttl, Some(options)))
                .await
                .map_err(|_| ReplayError::Apply {
                    revision,
                    detail: format!("granting lease {id:x}: no answer within {CALL_TIMEOUT:?}"),
                })?;
        match answer {
            Ok(_) => {}
            // Granted earlier under this ID (a lease the snapshot holds but did not list).
            Err(etcd_client::Error::GRpcStatus(s)) if s.message().contains("already exists") => {}
            Err(e) => {
                return Err(ReplayError::Apply {
                    revision,
                    detail: format!("granting lease {id:x} (TTL {ttl} s): {e}"),
                })
            }
        }
        self.kept(id);
        Ok(())
    }
}

/// Keeps every lease sent on `add` alive until aborted.
async fn keep_alive(mut client: Client, mut add: tokio::sync::mpsc::UnboundedReceiver<i64>) {
    let mut keepers = Vec::new();
    // The answers are read (and dropped) so the streams never stall.
    let mut drains = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(KEEP_ALIVE_EVERY);
    loop {
        tokio::select! {
            id = add.recv() => {
                let Some(id) = id else { return };
                match client.lease_keep_alive(id).await {
                    Ok((mut keeper, mut answers)) => {
                        let _ = keeper.keep_alive().await;
                        drains.spawn(async move { while let Ok(Some(_)) = answers.message().await {} });
                        keepers.push(keeper);
                    }
                    Err(e) => tracing::warn!(lease = %format!("{id:x}"), error = %e, "archive replay: cannot keep this lease alive"),
                }
            }
            _ = tick.tick() => {
                for k in &mut keepers {
                    let _ = k.keep_alive().await;
                }
            }
        }
    }
}
