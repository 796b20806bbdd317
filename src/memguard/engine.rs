//! The engine the guard watches and may stop: a process group (venv runtime) or a container
//! (docker runtime). A container's processes are its cgroup's members and its memory is the
//! cgroup's charge ([`super::cgroup`]); stopping it goes through `docker kill --signal`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;

use super::attribution::{BUCKETS, MAX_PROCS};
use super::cgroup::{self, Version};

/// A Docker container id (64 hex digits), kept inline so the guard's loop can copy it freely.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ContainerId([u8; 64]);

impl ContainerId {
    /// A full 64-hex-digit id (what `docker inspect --format '{{.Id}}'` prints).
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        let b = s.trim().as_bytes();
        let b: [u8; 64] = b.try_into().ok()?;
        b.iter().all(u8::is_ascii_hexdigit).then_some(Self(b))
    }

    #[must_use]
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever stored (see `parse`).
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Debug for ContainerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ContainerId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The engine as the guard sees it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineRef {
    /// The engine's process group (venv runtime: `spark-kit __engine` and its children).
    Group(i32),
    /// A container; `pid` is its main process on the host (`docker inspect {{.State.Pid}}`).
    Container { id: ContainerId, pid: i32 },
}

impl EngineRef {
    /// The number receipts and events name the engine by: its pgid, or its main pid.
    #[must_use]
    pub const fn id(&self) -> i32 {
        match self {
            EngineRef::Group(p) | EngineRef::Container { pid: p, .. } => *p,
        }
    }
}

/// Where the engine is now (it changes when the engine restarts). A closure returning the
/// process group id is one (venv runtime); the docker runtime returns containers.
pub trait EngineSource: Send {
    fn engine(&self) -> Option<EngineRef>;
}

impl<F: Fn() -> Option<i32> + Send> EngineSource for F {
    fn engine(&self) -> Option<EngineRef> {
        self().map(EngineRef::Group)
    }
}

/// An engine source that always answers the same container.
pub struct FixedContainer(pub EngineRef);

impl EngineSource for FixedContainer {
    fn engine(&self) -> Option<EngineRef> {
        Some(self.0)
    }
}

/// Why a container's cgroup cannot be watched.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} names no memory cgroup")]
    NoMemoryCgroup { path: PathBuf },
}

/// A container's memory cgroup, its files open; read on every scan without allocating.
pub struct CgroupWatch {
    pub version: Version,
    pub dir: PathBuf,
    usage: File,
    stat: File,
    /// `cgroup.procs`, opened anew on every read: cgroup v1 caches a reader's pid list for a
    /// second after each read, so a file held open and re-read every scan never sees a process
    /// that joined later (a `docker exec` into the container).
    procs: PathBuf,
    buf: Box<[u8; 65536]>,
    /// Members at the last read, sorted.
    pub members: Vec<i32>,
    /// Charged bytes at the last read.
    pub charged: u64,
    /// Charged bytes at the start of each bucket.
    pub hist: [u64; BUCKETS],
}

impl CgroupWatch {
    /// Find the memory cgroup of host pid `pid` under `cgroup_root` (`/sys/fs/cgroup`) and open it.
    pub fn open(proc_root: &Path, cgroup_root: &Path, pid: i32) -> Result<Self, WatchError> {
        let read = |p: PathBuf| std::fs::read_to_string(&p).map_err(|source| WatchError::Read { path: p, source });
        let version = cgroup::detect(std::fs::read_to_string(cgroup_root.join("cgroup.controllers")).ok().as_deref());
        let cg_file = proc_root.join(format!("{pid}/cgroup"));
        let text = read(cg_file.clone())?;
        let rel = cgroup::memory_path(&text, version).ok_or(WatchError::NoMemoryCgroup { path: cg_file })?;
        let mount = match version {
            Version::V1 => cgroup_root.join("memory"),
            Version::V2 => cgroup_root.to_path_buf(),
        };
        let dir = mount.join(rel.trim_start_matches('/'));
        let open = |name: &str| {
            let p = dir.join(name);
            File::open(&p).map_err(|source| WatchError::Read { path: p, source })
        };
        let mut w = Self {
            version,
            usage: open(version.usage_file())?,
            stat: open("memory.stat")?,
            procs: {
                open("cgroup.procs")?;
                dir.join("cgroup.procs")
            },
            dir,
            buf: Box::new([0; 65536]),
            members: Vec::with_capacity(MAX_PROCS),
            charged: 0,
            hist: [0; BUCKETS],
        };
        w.read();
        w.hist = [w.charged; BUCKETS];
        Ok(w)
    }

    /// Re-read members and charge. A cgroup that is gone (the container exited) reads as empty.
    pub fn read(&mut self) {
        // A fresh open: the path is short, so std converts it on the stack (no allocation).
        let n = File::open(&self.procs).and_then(|f| f.read_at(&mut self.buf[..], 0)).unwrap_or(0);
        cgroup::procs_into(&self.buf[..n], &mut self.members);
        let n = self.usage.read_at(&mut self.buf[..], 0).unwrap_or(0);
        let usage = cgroup::number(&self.buf[..n]);
        let n = self.stat.read_at(&mut self.buf[..], 0).unwrap_or(0);
        let inactive = cgroup::stat_value(&self.buf[..n], self.version.inactive_file_key()).unwrap_or(0);
        self.charged = usage.map_or(0, |u| u.saturating_sub(inactive));
    }

    /// SIGKILL every process of the cgroup from the host: on v2 through `cgroup.kill` (the kernel
    /// kills the whole cgroup at once, no pid can be reused under it; Linux 5.14+), else each
    /// member by pid, the list read anew just before. What was refused, if anything (the right to
    /// do it: root, or the processes' user).
    pub fn kill_all(&mut self) -> Option<String> {
        let kill_file = self.dir.join("cgroup.kill");
        if self.version == Version::V2 && kill_file.exists() {
            return std::fs::write(&kill_file, b"1").err().map(|e| format!("{}: {e}", kill_file.display()));
        }
        self.read();
        let refused: Vec<String> = self
            .members
            .iter()
            .filter_map(|&p| match kill(Pid::from_raw(p), Signal::SIGKILL) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => None,
                Err(e) => Some(format!("{p}: {e}")),
            })
            .collect();
        let n = self.members.len();
        (!refused.is_empty()).then(|| format!("{} of {n} refused ({})", refused.len(), refused.join(", ")))
    }

    /// Record the charge as the start of every bucket from `first` to `last`.
    pub fn mark(&mut self, first: u64, last: u64) {
        for b in first..=last {
            self.hist[usize::try_from(b % BUCKETS as u64).unwrap_or(0)] = self.charged;
        }
    }

    /// Growth of the charge over the window that ends at `bucket`.
    #[must_use]
    pub fn grown(&self, bucket: u64) -> u64 {
        let oldest = bucket.saturating_sub(BUCKETS as u64 - 1);
        self.charged.saturating_sub(self.hist[usize::try_from(oldest % BUCKETS as u64).unwrap_or(0)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids() {
        let s = "c5e57e6e5a4c66c6bb5393a24e94ab6429ba610be4a7108fed846a4b5ab32239";
        let id = ContainerId::parse(&format!("{s}\n")).unwrap();
        assert_eq!(id.as_str(), s);
        assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{s}\""));
        assert!(ContainerId::parse("c5e57e6e5a4c").is_none());
        assert!(ContainerId::parse(&s.replace('c', "z")).is_none());
    }

    #[test]
    fn watches_a_recorded_v1_cgroup() {
        let root = tempfile::tempdir().unwrap();
        let (proc_root, cg) = (root.path().join("proc"), root.path().join("cg"));
        std::fs::create_dir_all(proc_root.join("42")).unwrap();
        std::fs::write(proc_root.join("42/cgroup"), "4:memory:/docker/abc\n0::/docker/abc\n").unwrap();
        let dir = cg.join("memory/docker/abc");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy("tests/fixtures/cgroup/v1-memory.stat", dir.join("memory.stat")).unwrap();
        std::fs::copy("tests/fixtures/cgroup/v1-memory.usage_in_bytes", dir.join("memory.usage_in_bytes")).unwrap();
        std::fs::write(dir.join("cgroup.procs"), "43\n42\n").unwrap();
        let mut w = CgroupWatch::open(&proc_root, &cg, 42).unwrap();
        assert_eq!((w.version, w.members.as_slice(), w.charged), (Version::V1, &[42, 43][..], 6_877_184));
        std::fs::write(dir.join("memory.usage_in_bytes"), format!("{}\n", 216_592_384 + (1u64 << 30))).unwrap();
        w.read();
        assert_eq!(w.grown(3), 1 << 30);
        w.mark(4, 11);
        assert_eq!(w.grown(11), 0);
        assert!(matches!(CgroupWatch::open(&proc_root, &cg, 7), Err(WatchError::Read { .. })));
    }

    #[test]
    fn a_v2_cgroup_is_killed_through_cgroup_kill() {
        let root = tempfile::tempdir().unwrap();
        let (proc_root, cg) = (root.path().join("proc"), root.path().join("cg"));
        std::fs::create_dir_all(proc_root.join("42")).unwrap();
        std::fs::write(proc_root.join("42/cgroup"), "0::/system.slice/docker-abc.scope\n").unwrap();
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(cg.join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
        let dir = cg.join("system.slice/docker-abc.scope");
        std::fs::create_dir_all(&dir).unwrap();
        for (f, text) in [("memory.current", "1000\n"), ("memory.stat", "inactive_file 0\n"), ("cgroup.procs", "42\n")]
        {
            std::fs::write(dir.join(f), text).unwrap();
        }
        std::fs::write(dir.join("cgroup.kill"), "").unwrap();
        let mut w = CgroupWatch::open(&proc_root, &cg, 42).unwrap();
        assert_eq!((w.version, w.members.as_slice()), (Version::V2, [42].as_slice()));
        // Pid 42 is not signalled (it may be anything on this machine): the kernel's file is written.
        assert_eq!(w.kill_all(), None);
        assert_eq!(std::fs::read_to_string(dir.join("cgroup.kill")).unwrap(), "1");
    }
}
