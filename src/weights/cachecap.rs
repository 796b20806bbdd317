//! `spark-kit __cache-capped --cap BYTES -- PROGRAM ARGS…`: run a copy program (rsync, on the
//! head and on the node) and keep the page cache its files leave behind under `cap`. On GB10 the
//! page cache lives in the same memory as the GPU's, and a 95 GiB shard streamed through it
//! starves the next boot. Every time the process tree has read or written another `cap / 2`
//! bytes (and at least every 2 s), each regular file it has open is flushed (`fdatasync`) and
//! dropped from the cache (`posix_fadvise(DONTNEED)`) through a descriptor of our own, which also
//! reaches a file renamed since; the last sweep runs when the program exits. Needs no privilege.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

use crate::engine::pgroup::{parse_stat, Stat};

/// `rchar + wchar` from a `/proc/<pid>/io` text.
#[must_use]
pub fn io_bytes(text: &str) -> Option<u64> {
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<u64>().ok()));
    Some(field("rchar:")?.saturating_add(field("wchar:")?))
}

/// `root` and all its descendants among `procs`.
#[must_use]
pub fn tree(root: i32, procs: &[Stat]) -> Vec<i32> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let parent = out[i];
        out.extend(procs.iter().filter(|s| s.ppid == parent && s.state != 'Z').map(|s| s.pid));
        i += 1;
    }
    out
}

/// Whether a sweep is due.
#[must_use]
pub fn due(moved_since_sweep: u64, cap: u64, since_sweep: Duration) -> bool {
    moved_since_sweep >= (cap / 2).max(1) || since_sweep >= Duration::from_secs(2)
}

fn all_stats() -> Vec<Stat> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|s| parse_stat(&s))
        .collect()
}

/// The files a run has touched, by (device, inode), each with a descriptor of our own.
#[derive(Default)]
struct Touched {
    files: BTreeMap<(u64, u64), File>,
}

/// At most this many descriptors are kept; older ones are swept and closed.
const KEEP: usize = 256;

impl Touched {
    fn collect(&mut self, pids: &[i32]) {
        for pid in pids {
            let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
            for fd in fds.flatten() {
                let Ok(target) = std::fs::read_link(fd.path()) else { continue };
                let t = target.to_string_lossy();
                if !t.starts_with('/') || t.starts_with("/dev/") || t.starts_with("/proc/") {
                    continue;
                }
                let Ok(f) = File::open(fd.path()) else { continue };
                let Ok(m) = f.metadata() else { continue };
                if m.is_file() {
                    self.files.entry((m.dev(), m.ino())).or_insert(f);
                }
            }
        }
        while self.files.len() > KEEP {
            if let Some((_, f)) = self.files.pop_first() {
                drop_file(&f);
            }
        }
    }

    fn sweep(&self) {
        for f in self.files.values() {
            drop_file(f);
        }
    }
}

fn drop_file(f: &File) {
    // Dirty pages cannot be dropped: write them back first.
    let _ = f.sync_data();
    let _ = posix_fadvise(f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
}

/// Run `argv` (stdio inherited: rsync's server side speaks over it) under the cap.
pub fn run(argv: &[String], cap: u64) -> std::io::Result<ExitStatus> {
    let (prog, args) = argv.split_first().ok_or_else(|| std::io::Error::other("no program given after --"))?;
    let mut child = Command::new(prog).args(args).spawn()?;
    let root = i32::try_from(child.id()).unwrap_or(i32::MAX);
    let mut touched = Touched::default();
    let mut last_bytes = 0u64;
    let mut last_sweep = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            touched.sweep();
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(100));
        let pids = tree(root, &all_stats());
        let bytes: u64 = pids
            .iter()
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/io")).ok())
            .filter_map(|t| io_bytes(&t))
            .sum();
        if due(bytes.saturating_sub(last_bytes), cap, last_sweep.elapsed()) {
            touched.collect(&pids);
            touched.sweep();
            last_bytes = bytes;
            last_sweep = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_io() {
        let t = "rchar: 100\nwchar: 23\nsyscr: 4\nsyscw: 2\nread_bytes: 0\nwrite_bytes: 0\n";
        assert_eq!(io_bytes(t), Some(123));
        assert_eq!(io_bytes("rchar: 1\n"), None);
    }

    #[test]
    fn finds_the_whole_tree_but_not_zombies_or_strangers() {
        let s = |pid, ppid, state| Stat { pid, comm: "x".into(), state, ppid, pgrp: 1 };
        let procs = vec![s(10, 1, 'S'), s(11, 10, 'S'), s(12, 11, 'R'), s(13, 10, 'Z'), s(14, 1, 'S')];
        assert_eq!(tree(10, &procs), vec![10, 11, 12]);
    }

    #[test]
    fn sweeps_on_bytes_or_time() {
        assert!(!due(100, 1000, Duration::from_millis(500)));
        assert!(due(500, 1000, Duration::from_millis(500)));
        assert!(due(0, 1000, Duration::from_secs(2)));
    }
}
