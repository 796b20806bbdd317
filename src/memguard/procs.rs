//! Per-process memory from `/proc/<pid>/stat`: a pure, allocation-free parser and a scanner
//! that walks `/proc` through pre-opened descriptors into a preallocated table, so it can run on
//! the guard's hot path. (`engine::pgroup::parse_stat` is the allocating variant for callers
//! that want owned strings.)

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::dir::Dir;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;

/// A process name as the kernel keeps it (`comm`, at most 15 bytes), stored inline.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Comm {
    bytes: [u8; 16],
    len: u8,
}

impl Comm {
    #[must_use]
    pub fn new(name: &[u8]) -> Self {
        let mut c = Self::default();
        let n = name.len().min(16);
        c.bytes[..n].copy_from_slice(&name[..n]);
        // n ≤ 16, so it fits in a u8.
        c.len = u8::try_from(n).unwrap_or(16);
        c
    }
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
    #[must_use]
    pub fn as_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(self.as_bytes())
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// The fields of `/proc/<pid>/stat` the guard uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: i32,
    pub comm: Comm,
    pub state: u8,
    pub ppid: i32,
    pub pgrp: i32,
    /// Start time in clock ticks after boot: with the pid, identifies the process across reuse.
    pub starttime: u64,
    /// Resident set in pages.
    pub rss_pages: u64,
}

/// Parse one `/proc/<pid>/stat` line (comm may hold spaces and parentheses: the fields after it
/// are found from the last `)`). Pure, no allocation.
#[must_use]
pub fn parse_stat(line: &[u8]) -> Option<ProcStat> {
    let open = line.iter().position(|&b| b == b'(')?;
    let close = line.iter().rposition(|&b| b == b')')?;
    let pid = parse_i64(trim(&line[..open]))?;
    let comm = Comm::new(line.get(open + 1..close)?);
    let mut rest = line.get(close + 1..)?.split(|&b| b == b' ').filter(|w| !w.is_empty());
    // Fields 3.. of proc(5): state ppid pgrp session tty tpgid flags minflt cminflt majflt
    // cmajflt utime stime cutime cstime priority nice threads itreal starttime vsize rss.
    let state = *rest.next()?.first()?;
    let ppid = parse_i64(rest.next()?)?;
    let pgrp = parse_i64(rest.next()?)?;
    let mut rest = rest.skip(16);
    let starttime = u64::try_from(parse_i64(rest.next()?)?).ok()?;
    let _vsize = rest.next()?;
    let rss_pages = u64::try_from(parse_i64(rest.next()?)?.max(0)).ok()?;
    Some(ProcStat {
        pid: i32::try_from(pid).ok()?,
        comm,
        state,
        ppid: i32::try_from(ppid).ok()?,
        pgrp: i32::try_from(pgrp).ok()?,
        starttime,
        rss_pages,
    })
}

fn trim(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(s.len());
    let end = s.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |e| e + 1);
    &s[start..end]
}

fn parse_i64(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.split_first() {
        Some((b'-', d)) => (true, d),
        _ => (false, s),
    };
    if digits.is_empty() {
        return None;
    }
    let mut v: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(i64::from(b - b'0'))?;
    }
    Some(if neg { -v } else { v })
}

/// Reads whole small files relative to a pre-opened directory into a fixed buffer.
pub struct ProcDir {
    dir: Dir,
    fd: OwnedFd,
    buf: Box<[u8; 4096]>,
}

impl ProcDir {
    /// Open `/proc` (or a recorded tree standing in for it).
    pub fn open(root: &std::path::Path) -> std::io::Result<Self> {
        let fd: OwnedFd =
            nix::fcntl::open(root, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
                .map_err(std::io::Error::from)?;
        let dir = Dir::openat(fd.as_fd(), ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(std::io::Error::from)?;
        Ok(Self { dir, fd, buf: Box::new([0; 4096]) })
    }

    /// Call `f` with the `stat` of every process, in directory order. Allocation-free.
    pub fn for_each_stat(&mut self, mut f: impl FnMut(&ProcStat)) {
        let dirfd = self.fd.as_raw_fd();
        let buf = &mut self.buf;
        for entry in self.dir.iter().flatten() {
            let name = entry.file_name().to_bytes();
            if name.is_empty() || !name.iter().all(u8::is_ascii_digit) || name.len() > 10 {
                continue;
            }
            let mut path = [0u8; 16];
            path[..name.len()].copy_from_slice(name);
            path[name.len()..name.len() + 5].copy_from_slice(b"/stat");
            let Some(n) = read_at(dirfd, &path[..name.len() + 5], &mut buf[..]) else { continue };
            if let Some(s) = parse_stat(&buf[..n]) {
                f(&s);
            }
        }
    }

    /// Read `<pid>/<file>` into the buffer and hand it to `f`.
    pub fn with_file<T>(&mut self, pid: i32, file: &str, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let mut path = [0u8; 64];
        let mut w = Cursor { buf: &mut path, len: 0 };
        std::fmt::Write::write_fmt(&mut w, format_args!("{pid}/{file}")).ok()?;
        let len = w.len;
        let n = read_at(self.fd.as_raw_fd(), &path[..len], &mut self.buf[..])?;
        Some(f(&self.buf[..n]))
    }
}

/// A fixed-size formatting target (no allocation).
struct Cursor<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl std::fmt::Write for Cursor<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Read a file relative to `dirfd` into `buf`; the number of bytes read.
fn read_at(dirfd: i32, rel: &[u8], buf: &mut [u8]) -> Option<usize> {
    // SAFETY: `dirfd` is a descriptor the caller owns and keeps open for this call.
    let dir = unsafe { std::os::fd::BorrowedFd::borrow_raw(dirfd) };
    let fd = openat(dir, rel, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
    let mut total = 0;
    while total < buf.len() {
        match nix::unistd::read(&fd, &mut buf[total..]) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return None,
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_recorded_stat_lines() {
        let line = include_bytes!("../../tests/fixtures/node/gb10-healthy/proc/4242/stat");
        let s = parse_stat(line).unwrap();
        assert_eq!((s.pid, s.ppid, s.pgrp, s.state), (4242, 4200, 4100, b'S'));
        assert_eq!(s.comm.as_bytes(), b"VLLM::Worker_TP");
        assert_eq!(s.starttime, 91_234);
        assert_eq!(s.rss_pages, 471_859);
        let odd = parse_stat(b"77 (a) b (c)) R 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 100 -3 1").unwrap();
        assert_eq!(odd.comm.as_bytes(), b"a) b (c)");
        assert_eq!(odd.rss_pages, 0);
    }

    #[test]
    fn refuses_truncated_lines() {
        assert!(parse_stat(b"1 (x) S 0 1").is_none());
        assert!(parse_stat(b"garbage").is_none());
    }

    #[test]
    fn scans_this_machine_and_finds_itself() {
        let mut dir = ProcDir::open(std::path::Path::new("/proc")).unwrap();
        let me = i32::try_from(std::process::id()).unwrap();
        let mut found = None;
        dir.for_each_stat(|s| {
            if s.pid == me {
                found = Some(*s);
            }
        });
        let s = found.unwrap();
        assert!(s.rss_pages > 0);
        let adj = dir.with_file(me, "oom_score_adj", |b| b.to_vec()).unwrap();
        assert!(!adj.is_empty());
    }
}
