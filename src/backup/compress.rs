//! Snapshots compressed on their way to the store (zstd, streamed): plaintext in,
//! compressed bytes out, chunk by chunk, so memory stays bounded whatever the database's
//! size. The manifest records it (`compression: "zstd"`); a manifest without the field is
//! the plain database, as every snapshot taken before compression existed.

use std::io::{Read, Write};

/// How new snapshots are stored (`--backup-compression`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// zstd at [`LEVEL`], with a content checksum in the frame.
    #[default]
    Zstd,
    /// The database as etcd streams it.
    None,
}

/// The manifest's name for zstd.
pub const ZSTD: &str = "zstd";

/// zstd's level: its default, fast enough to keep up with etcd's stream on one core.
pub const LEVEL: i32 = 3;

/// The largest window a download accepts (16 MiB of decoder memory): ours use 2 MiB at
/// [`LEVEL`]; an object asking for more is refused instead of growing memory.
const WINDOW_LOG_MAX: u32 = 24;

impl Compression {
    /// `zstd` or `none`, as the option takes it.
    pub fn parse(s: &str) -> Option<Compression> {
        match s {
            ZSTD => Some(Compression::Zstd),
            "none" => Some(Compression::None),
            _ => None,
        }
    }

    /// What the manifest records: `Some("zstd")`, or nothing for the plain database.
    pub fn manifest_name(self) -> Option<String> {
        match self {
            Compression::Zstd => Some(ZSTD.to_string()),
            Compression::None => None,
        }
    }
}

/// Compresses a stream chunk by chunk. zstd's encoder buffers up to one block (128 KiB)
/// and its window (2 MiB at level 3); what it has written so far is taken out at each call.
pub struct Compressing(zstd::stream::write::Encoder<'static, Vec<u8>>);

impl Compressing {
    pub fn new() -> std::io::Result<Compressing> {
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), LEVEL)?;
        encoder.include_checksum(true)?;
        Ok(Compressing(encoder))
    }

    /// Compresses `plain`; returns the compressed bytes ready so far (often empty).
    pub fn update(&mut self, plain: &[u8]) -> std::io::Result<Vec<u8>> {
        self.0.write_all(plain)?;
        Ok(std::mem::take(self.0.get_mut()))
    }

    /// The rest of the compressed stream, with the frame's end and checksum.
    pub fn finish(self) -> std::io::Result<Vec<u8>> {
        self.0.finish()
    }
}

/// A reader of the plaintext behind a zstd stream (memory bounded by the window limit).
pub fn decompressing<R: Read + Send + 'static>(
    compressed: R,
) -> std::io::Result<Box<dyn Read + Send>> {
    let mut decoder = zstd::stream::read::Decoder::new(compressed)?;
    decoder.window_log_max(WINDOW_LOG_MAX)?;
    Ok(Box::new(decoder))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn compress(plain: &[u8], chunk: usize) -> Vec<u8> {
        let mut c = Compressing::new().unwrap();
        let mut out = Vec::new();
        for part in plain.chunks(chunk) {
            out.extend(c.update(part).unwrap());
        }
        out.extend(c.finish().unwrap());
        out
    }

    fn plain() -> Vec<u8> {
        (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect()
    }

    #[test]
    fn a_compressed_stream_reads_back_whatever_the_chunking() {
        let plain = plain();
        for chunk in [1000, 32 * 1024, 5 << 20] {
            let packed = compress(&plain, chunk);
            assert!(packed.len() < plain.len() / 10, "{}", packed.len());
            let mut back = Vec::new();
            decompressing(std::io::Cursor::new(packed))
                .unwrap()
                .read_to_end(&mut back)
                .unwrap();
            assert!(back == plain, "chunk {chunk}");
        }
    }

    #[test]
    fn a_flipped_byte_in_the_compressed_stream_fails_to_read() {
        let mut packed = compress(&plain(), 4096);
        let at = packed.len() / 2;
        packed[at] ^= 0x10;
        let mut back = Vec::new();
        let read = decompressing(std::io::Cursor::new(packed))
            .unwrap()
            .read_to_end(&mut back);
        assert!(read.is_err(), "read {} bytes without an error", back.len());
    }

    #[test]
    fn the_option_names_parse() {
        assert_eq!(Compression::parse("zstd"), Some(Compression::Zstd));
        assert_eq!(Compression::parse("none"), Some(Compression::None));
        assert_eq!(Compression::parse("gzip"), None);
        assert_eq!(
            Compression::default().manifest_name().as_deref(),
            Some("zstd")
        );
        assert_eq!(Compression::None.manifest_name(), None);
    }
}
