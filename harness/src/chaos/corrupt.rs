//! The corrupted value ([`Fault::CorruptValue`](super::Fault::CorruptValue)): changing an
//! acknowledged write's value in a stopped member's database file, and reading what every
//! member serves under the writer's keys, to see that no member serves a value never written.

use std::path::Path;

use etcd_client::GetOptions;

use crate::loopback::Set;
use crate::writer::{write_key, write_value};

/// The writer's values changed into these on disk: as long, never written.
const FROM: &[u8] = b"written-";
const TO: &[u8] = b"corrupt-";

/// The write whose value was changed, and in how many places of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupted {
    /// Write `w/<i>`.
    pub i: u64,
    /// How many copies of its value the file held (live and stale pages alike).
    pub copies: usize,
}

/// Changes the value of one of the writes `0..acked` in `data_dir`'s database file (its
/// etcd stopped): the newest found of the first half (long acknowledged: committed to the
/// file, not only in the WAL), every copy in the file, each into as many other bytes.
/// `None`: no such value in the file.
pub fn corrupt_value(data_dir: &Path, acked: u64) -> std::io::Result<Option<Corrupted>> {
    let path = data_dir.join("member/snap/db");
    let mut bytes = std::fs::read(&path)?;
    let found = values_in(&bytes);
    let Some(i) = found
        .iter()
        .map(|(i, _)| *i)
        .filter(|i| *i < acked / 2)
        .max()
    else {
        return Ok(None);
    };
    let at: Vec<usize> = found
        .iter()
        .filter(|(j, _)| *j == i)
        .map(|(_, a)| *a)
        .collect();
    for a in &at {
        bytes[*a..*a + TO.len()].copy_from_slice(TO);
    }
    std::fs::write(&path, &bytes)?;
    Ok(Some(Corrupted {
        i,
        copies: at.len(),
    }))
}

/// Every writer's value in `bytes`: its write's number and where it starts.
fn values_in(bytes: &[u8]) -> Vec<(u64, usize)> {
    let len = write_value(0).len();
    let mut found = Vec::new();
    let mut a = 0;
    while a + len <= bytes.len() {
        let candidate = &bytes[a..a + len];
        let i = candidate
            .starts_with(FROM)
            .then(|| std::str::from_utf8(&candidate[FROM.len()..]).ok())
            .flatten()
            .and_then(|n| n.parse::<u64>().ok());
        match i {
            Some(i) if write_value(i).as_bytes() == candidate => {
                found.push((i, a));
                a += len;
            }
            _ => a += 1,
        }
    }
    found
}

/// The writer's keys that a serializable read through pod `o` serves with a value the writer
/// never wrote under them: key and value. `None`: the read failed.
pub async fn unwritten_values(set: &Set, o: u32) -> Option<Vec<(String, String)>> {
    let mut c = set.client(o).await.ok()?;
    let mut unwritten = Vec::new();
    let mut from = "w/".to_string();
    loop {
        let opts = GetOptions::new()
            .with_range("w0")
            .with_serializable()
            .with_limit(2000);
        let r = c.get(from.clone(), Some(opts)).await.ok()?;
        for kv in r.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let value = String::from_utf8_lossy(kv.value()).into_owned();
            let written = key
                .strip_prefix("w/")
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|i| write_key(i) == key && write_value(i) == value);
            if !written {
                unwritten.push((key, value));
            }
        }
        match (r.more(), r.kvs().last()) {
            (true, Some(last)) => {
                from = format!("{}\0", String::from_utf8_lossy(last.key()));
            }
            _ => return Some(unwritten),
        }
    }
}

/// Whether every pod of `pods` answers a serializable read and serves only written values.
pub async fn all_written(set: &Set, pods: &[u32]) -> bool {
    for o in pods {
        if unwritten_values(set, *o)
            .await
            .is_none_or(|u| !u.is_empty())
        {
            return false;
        }
    }
    true
}
