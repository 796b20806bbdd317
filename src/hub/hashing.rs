//! Content hashes: SHA-256 (sha2 picks the CPU's SHA instructions at run time) and git blob sha1.

use std::fs::File;
use std::os::unix::fs::FileExt;

use sha1::Digest as _;

use crate::hex::encode as hex;

/// `sha1(b"blob <len>\0" + content)`: the id git (and the Hub's tree `oid`) gives a regular file.
#[must_use]
pub fn git_sha1(content: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", content.len()).as_bytes());
    h.update(content);
    hex(&h.finalize())
}

#[must_use]
pub fn sha256(content: &[u8]) -> String {
    hex(&sha2::Sha256::digest(content))
}

/// Read size of one hashing step.
pub const HASH_CHUNK: usize = 8 << 20;

/// Tell the kernel the pages of `[offset, offset+len)` are not needed again, so hashing a large
/// file does not push everything else out of the page cache.
pub fn drop_cached(file: &File, offset: u64, len: u64) {
    let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
    // Advice only: failure (e.g. on a filesystem without it) changes nothing but memory use.
    let _ = nix::fcntl::posix_fadvise(file, off, len, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED);
}

/// SHA-256 and length of a whole file, read in chunks with `drop_cached` after each, calling
/// `progress(bytes)` per chunk.
pub fn sha256_file(file: &File, mut progress: impl FnMut(u64)) -> std::io::Result<(String, u64)> {
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; HASH_CHUNK];
    let mut off = 0u64;
    loop {
        let n = file.read_at(&mut buf, off)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        drop_cached(file, off, n as u64);
        off += n as u64;
        progress(n as u64);
    }
    Ok((hex(&h.finalize()), off))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(git_sha1(b"hello\n"), "ce013625030ba8dba906f756967f9e9ca394464a");
        assert_eq!(sha256(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, vec![7u8; HASH_CHUNK + 5]).unwrap();
        let mut seen = 0;
        let (h, n) = sha256_file(&File::open(&p).unwrap(), |b| seen += b).unwrap();
        assert_eq!((n, seen), ((HASH_CHUNK + 5) as u64, (HASH_CHUNK + 5) as u64));
        assert_eq!(h, sha256(&vec![7u8; HASH_CHUNK + 5]));
    }
}
