//! Free-space check before a download starts.

use std::path::{Path, PathBuf};

/// Bytes needed on disk for `remaining` bytes still to fetch: 5 % headroom.
#[must_use]
pub fn needed(remaining: u64) -> u64 {
    remaining.saturating_add(remaining / 20)
}

/// Free bytes (for an unprivileged user) on the filesystem holding `path` or its nearest
/// existing ancestor, with the directory actually measured.
pub fn free_bytes(path: &Path) -> std::io::Result<(u64, PathBuf)> {
    let mut p = path.to_path_buf();
    while !p.exists() {
        if !p.pop() {
            p = PathBuf::from("/");
            break;
        }
    }
    let st = nix::sys::statvfs::statvfs(&p).map_err(std::io::Error::from)?;
    #[allow(clippy::useless_conversion)] // the field types differ between libc targets
    let free = u64::from(st.blocks_available()).saturating_mul(u64::from(st.fragment_size()));
    Ok((free, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headroom_and_measure() {
        assert_eq!(needed(100), 105);
        assert_eq!(needed(u64::MAX), u64::MAX);
        let d = tempfile::tempdir().unwrap();
        let (free, at) = free_bytes(&d.path().join("not/yet/there")).unwrap();
        assert!(free > 0);
        assert_eq!(at, d.path());
    }
}
