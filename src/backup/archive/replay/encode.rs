//! etcd's encodings of what its backend file holds, pure: a revision's key in the `key`
//! bucket (`main_sub`, a delete's ending in `t`), the `mvccpb.KeyValue` stored under it and
//! the `leasepb.Lease` of the `lease` bucket, written as etcd's protobuf encoder writes them
//! and read back.

/// etcd's key for revision `main`, change `sub`; a delete's ends in `t`.
pub fn revision_key(main: i64, sub: i64, tombstone: bool) -> Vec<u8> {
    let mut k = Vec::with_capacity(18);
    k.extend_from_slice(&main.to_be_bytes());
    k.push(b'_');
    k.extend_from_slice(&sub.to_be_bytes());
    if tombstone {
        k.push(b't');
    }
    k
}

/// The main revision of an etcd revision key, and whether it marks a delete.
pub fn main_of(k: &[u8]) -> Option<(i64, bool)> {
    if (k.len() != 17 && k.len() != 18) || k[8] != b'_' {
        return None;
    }
    let mut m = [0u8; 8];
    m.copy_from_slice(&k[..8]);
    Some((i64::from_be_bytes(m), k.len() == 18 && k[17] == b't'))
}

fn varint(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

fn field_bytes(out: &mut Vec<u8>, field: u8, b: &[u8]) {
    if !b.is_empty() {
        out.push(field << 3 | 2);
        varint(out, b.len() as u64);
        out.extend_from_slice(b);
    }
}

fn field_int(out: &mut Vec<u8>, field: u8, x: i64) {
    if x != 0 {
        out.push(field << 3);
        varint(out, x as u64);
    }
}

/// A key's state: where its current life began and how many times it was written since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Live {
    pub create: i64,
    pub version: i64,
}

/// etcd's `mvccpb.KeyValue`, encoded as etcd's protobuf encoder does (fields in order,
/// zero values left out).
pub fn key_value(key: &[u8], live: Live, modified: i64, value: &[u8], lease: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + value.len() + 40);
    field_bytes(&mut out, 1, key);
    field_int(&mut out, 2, live.create);
    field_int(&mut out, 3, modified);
    field_int(&mut out, 4, live.version);
    field_bytes(&mut out, 5, value);
    field_int(&mut out, 6, lease);
    out
}

/// A tombstone's value: a `KeyValue` holding only the key.
pub fn tombstone_value(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 4);
    field_bytes(&mut out, 1, key);
    out
}

/// etcd's `leasepb.Lease` for a granted lease.
pub fn lease_value(id: i64, ttl: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    field_int(&mut out, 1, id);
    field_int(&mut out, 2, ttl);
    out
}

fn read_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut x = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        x |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(x);
        }
    }
    None
}

/// The key of an encoded `KeyValue`, and its creation revision and version.
pub fn read_key_value(b: &[u8]) -> Option<(&[u8], Live)> {
    let (mut at, mut key, mut live) = (
        0,
        None,
        Live {
            create: 0,
            version: 0,
        },
    );
    while at < b.len() {
        let tag = read_varint(b, &mut at)?;
        match tag & 7 {
            0 => {
                let x = read_varint(b, &mut at)? as i64;
                match tag >> 3 {
                    2 => live.create = x,
                    4 => live.version = x,
                    _ => {}
                }
            }
            2 => {
                let len = usize::try_from(read_varint(b, &mut at)?).ok()?;
                let field = b.get(at..at.checked_add(len)?)?;
                at += len;
                if tag >> 3 == 1 {
                    key = Some(field);
                }
            }
            _ => return None,
        }
    }
    Some((key.unwrap_or(&[]), live))
}

/// The change number of an etcd revision key (its `sub`).
pub fn sub_of(k: &[u8]) -> Option<i64> {
    main_of(k)?;
    let mut s = [0u8; 8];
    s.copy_from_slice(&k[9..17]);
    Some(i64::from_be_bytes(s))
}

/// The integer field `field` of an encoded protobuf message (0 when absent, as etcd's
/// decoder reads it); None when the message does not decode.
fn read_int(b: &[u8], field: u64) -> Option<i64> {
    let (mut at, mut out) = (0, 0i64);
    while at < b.len() {
        let tag = read_varint(b, &mut at)?;
        match tag & 7 {
            0 => {
                let x = read_varint(b, &mut at)? as i64;
                if tag >> 3 == field {
                    out = x;
                }
            }
            2 => {
                let len = usize::try_from(read_varint(b, &mut at)?).ok()?;
                at = at.checked_add(len).filter(|end| *end <= b.len())?;
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The lease an encoded `KeyValue` is attached to (0: none).
pub fn read_key_lease(b: &[u8]) -> Option<i64> {
    read_int(b, 6)
}

/// The ID and granted TTL of an encoded `leasepb.Lease`.
pub fn read_lease_value(b: &[u8]) -> Option<(i64, i64)> {
    Some((read_int(b, 1)?, read_int(b, 2)?))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn key_values_are_encoded_as_etcds_protobuf_encoder_does() {
        // mvccpb.KeyValue{Key:"k", CreateRevision:2, ModRevision:300, Version:1, Value:"v"}
        // as etcd marshals it: fields in order, zero lease left out, varints.
        let b = key_value(
            b"k",
            Live {
                create: 2,
                version: 1,
            },
            300,
            b"v",
            0,
        );
        assert_eq!(
            b,
            vec![0x0a, 1, b'k', 0x10, 2, 0x18, 0xac, 0x02, 0x20, 1, 0x2a, 1, b'v']
        );
        assert_eq!(tombstone_value(b"k"), vec![0x0a, 1, b'k']);
        assert_eq!(lease_value(0x1234, 60), vec![0x08, 0xb4, 0x24, 0x10, 60]);
    }

    #[test]
    fn a_keys_lease_and_a_leases_id_and_ttl_read_back_as_written() {
        let live = Live {
            create: 2,
            version: 1,
        };
        assert_eq!(
            read_key_lease(&key_value(b"k", live, 300, b"v", 0x694d)),
            Some(0x694d)
        );
        assert_eq!(
            read_key_lease(&key_value(b"k", live, 300, b"v", 0)),
            Some(0)
        );
        assert_eq!(read_key_lease(&tombstone_value(b"k")), Some(0));
        assert_eq!(
            read_lease_value(&lease_value(0x1234, 60)),
            Some((0x1234, 60))
        );
        // etcd's checkpointed remaining TTL (field 3) is not the granted one.
        let mut checkpointed = lease_value(0x1234, 60);
        checkpointed.extend_from_slice(&[0x18, 17]);
        assert_eq!(read_lease_value(&checkpointed), Some((0x1234, 60)));
        assert_eq!(read_key_lease(&[0x0a, 9, b'k']), None, "cut short");
        assert_eq!(sub_of(&revision_key(7, 3, true)), Some(3));
    }
}
