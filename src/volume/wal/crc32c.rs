//! CRC-32C (Castagnoli), the checksum etcd chains through its WAL records.

const POLY: u32 = 0x82f6_3b78;

const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// Continues a CRC-32C whose value so far is `crc` over `data`.
pub fn extend(crc: u32, data: &[u8]) -> u32 {
    let mut c = !crc;
    for b in data {
        c = TABLE[((c ^ u32::from(*b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

#[test]
fn the_check_value_of_crc32c_is_e3069283() {
    assert_eq!(extend(0, b"123456789"), 0xe306_9283);
    assert_eq!(extend(extend(0, b"1234"), b"56789"), 0xe306_9283);
}
