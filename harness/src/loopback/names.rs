//! The pods' stable names: the hosts file the set's dnsmasq serves, published and withdrawn.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use super::Set;
use crate::dns::Answer;
use crate::Result;

impl Set {
    // ---- DNS -------------------------------------------------------------------------------

    fn write_hosts(&mut self) -> Result<()> {
        let records: Vec<(Ipv4Addr, String)> = self
            .published
            .iter()
            .map(|o| {
                let ip = self
                    .wrong_addresses
                    .get(o)
                    .copied()
                    .unwrap_or(self.pod(*o).ip);
                (ip, self.host(*o))
            })
            .collect();
        self.dns.serve(&records)
    }

    /// Publishes (or withdraws) a pod's DNS name, as a headless service does while the pod
    /// exists; dnsmasq reloads asynchronously.
    pub fn set_dns(&mut self, o: u32, published: bool) -> Result<()> {
        if published {
            self.published.insert(o);
        } else {
            self.published.remove(&o);
        }
        self.write_hosts()
    }

    /// Publishes pod `o`'s name at `ip` (another pod's address: DNS answering wrong), or
    /// at its own address again with `None`.
    pub fn set_dns_address(&mut self, o: u32, ip: Option<Ipv4Addr>) -> Result<()> {
        match ip {
            Some(ip) => self.wrong_addresses.insert(o, ip),
            None => self.wrong_addresses.remove(&o),
        };
        self.set_dns(o, true)
    }

    /// Publishes pods' names and waits until dnsmasq answers them (keeping its reload out
    /// of whatever is measured next).
    pub async fn publish(&mut self, pods: &[u32]) -> Result<()> {
        self.published.extend(pods);
        self.write_hosts()?;
        for o in pods {
            let want = Answer::Found(vec![IpAddr::V4(self.pod(*o).ip)]);
            self.dns
                .wait_answer(&self.host(*o), want, Duration::from_secs(10))
                .await?;
        }
        Ok(())
    }

    /// Withdraws pods' names (the pods are gone) and waits until they no longer resolve.
    pub async fn withdraw(&mut self, pods: &[u32]) -> Result<()> {
        for o in pods {
            self.published.remove(o);
        }
        self.write_hosts()?;
        for o in pods {
            self.dns
                .wait_answer(&self.host(*o), Answer::NotFound, Duration::from_secs(10))
                .await?;
        }
        Ok(())
    }
}
