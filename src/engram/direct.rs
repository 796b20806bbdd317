//! Positional reads with `O_DIRECT` (4 KiB-aligned offset, length and buffer), falling back to
//! buffered reads where the filesystem refuses `O_DIRECT` (tmpfs on older kernels, some FUSE
//! and network filesystems). The page cache is bypassed, so looking rows up never fills the
//! host's memory (on GB10 that memory is the GPU's).

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::error::EngramError;

/// Alignment of offsets, lengths and buffers for `O_DIRECT`.
pub const ALIGN: u64 = 4096;

/// A reusable buffer whose usable part starts on a 4 KiB boundary (no `unsafe`: a larger
/// `Vec` and an offset into it).
#[derive(Debug, Default)]
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// The aligned slice of at least `len` bytes (grows when needed).
    pub fn get(&mut self, len: usize) -> &mut [u8] {
        if self.len < len {
            self.raw = vec![0u8; len + ALIGN as usize];
            self.start = self.raw.as_ptr().align_offset(ALIGN as usize);
            self.len = len;
        }
        &mut self.raw[self.start..self.start + len]
    }
}

/// An open file read at positions, directly or through the page cache.
#[derive(Debug)]
pub struct RowFile {
    file: File,
    path: PathBuf,
    direct: bool,
}

impl RowFile {
    /// Open `path` for reading, with `O_DIRECT` when `direct` and the filesystem allows it.
    /// Returns the file and, when `O_DIRECT` was asked for but refused, the reason.
    ///
    /// # Errors
    /// The file cannot be opened at all.
    pub fn open(path: &Path, direct: bool) -> Result<(Self, Option<String>), EngramError> {
        let buffered = || {
            File::open(path)
                .map(|file| Self { file, path: path.to_path_buf(), direct: false })
                .map_err(|e| EngramError::io(path, e))
        };
        if !direct {
            return Ok((buffered()?, None));
        }
        let file = match std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_DIRECT).open(path) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
                return Ok((buffered()?, Some(format!("O_DIRECT refused at open ({e})"))));
            }
            Err(e) => return Err(EngramError::io(path, e)),
        };
        // Some filesystems accept the flag and refuse the read: probe one aligned block.
        let mut probe = AlignedBuf::default();
        match file.read_at(probe.get(ALIGN as usize), 0) {
            Ok(_) => Ok((Self { file, path: path.to_path_buf(), direct: true }, None)),
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
                Ok((buffered()?, Some(format!("O_DIRECT read refused ({e})"))))
            }
            Err(e) => Err(EngramError::Read { path: path.to_path_buf(), offset: 0, len: ALIGN, source: e }),
        }
    }

    /// Whether reads bypass the page cache.
    #[must_use]
    pub const fn is_direct(&self) -> bool {
        self.direct
    }

    /// Drop `[offset, offset + len)` from the page cache (`len` 0: to the end), for buffered
    /// readers of large ranges.
    pub fn drop_cache(&self, offset: u64, len: u64) {
        let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
        let _ = nix::fcntl::posix_fadvise(&self.file, off, len, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED);
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Fill `out` from `offset`; `scratch` is the aligned bounce buffer for `O_DIRECT`.
    ///
    /// # Errors
    /// An I/O error or end of file before `out` is full, naming the file and offset.
    pub fn read_exact_at(&self, offset: u64, out: &mut [u8], scratch: &mut AlignedBuf) -> Result<(), EngramError> {
        let len = out.len() as u64;
        if !self.direct {
            return self.fill(offset, out, offset, len);
        }
        let start = offset & !(ALIGN - 1);
        let end = (offset + len).div_ceil(ALIGN) * ALIGN;
        let span = usize::try_from(end - start).map_err(|_| self.short(offset, len, 0))?;
        let buf = scratch.get(span);
        let mut got = 0usize;
        while got < span {
            match self.file.read_at(&mut buf[got..], start + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => return Err(EngramError::Read { path: self.path.clone(), offset, len, source }),
            }
        }
        let skip = (offset - start) as usize;
        if got < skip + out.len() {
            return Err(self.short(offset, len, got.saturating_sub(skip) as u64));
        }
        out.copy_from_slice(&buf[skip..skip + out.len()]);
        Ok(())
    }

    fn fill(&self, offset: u64, out: &mut [u8], report_offset: u64, len: u64) -> Result<(), EngramError> {
        let mut got = 0usize;
        while got < out.len() {
            match self.file.read_at(&mut out[got..], offset + got as u64) {
                Ok(0) => return Err(self.short(report_offset, len, got as u64)),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(EngramError::Read { path: self.path.clone(), offset: report_offset, len, source })
                }
            }
        }
        Ok(())
    }

    fn short(&self, offset: u64, len: u64, got: u64) -> EngramError {
        EngramError::ShortRead { path: self.path.clone(), offset, len, got }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_exact() {
        let mut b = AlignedBuf::default();
        assert_eq!(b.get(100).as_ptr() as usize % 4096, 0);
        assert_eq!(b.get(10_000).len(), 10_000);
        assert_eq!(b.get(10_000).as_ptr() as usize % 4096, 0);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        for direct in [false, true] {
            let (f, _) = RowFile::open(&p, direct).unwrap();
            let mut out = [0u8; 264];
            f.read_exact_at(4000, &mut out, &mut b).unwrap();
            assert_eq!(&out[..], &data[4000..4264]);
            f.read_exact_at(10_000 - 264, &mut out, &mut b).unwrap();
            assert_eq!(&out[..], &data[10_000 - 264..]);
            let e = f.read_exact_at(9_900, &mut out, &mut b).unwrap_err().to_string();
            assert!(e.contains("short read at offset 9900") && e.contains("got 100 of 264"), "{e}");
        }
    }
}
