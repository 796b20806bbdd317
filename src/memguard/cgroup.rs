//! Memory of a container, read from its cgroup (cgroup v1 and v2). The engine of a kit with
//! `engine.runtime: docker` runs in the container's cgroup, not in the agent's process group,
//! so the guard attributes it by the cgroup: its members (`cgroup.procs`) and its charged memory.
//!
//! Charged memory = usage − inactive file cache, the figure `docker stats` shows as "MEM USAGE":
//! page cache that the kernel can drop at once is not the engine's growth.
//! - v2: `memory.current` − `inactive_file` of `memory.stat`.
//! - v1: `memory.usage_in_bytes` − `total_inactive_file` of `memory.stat` (hierarchical).
//!
//! Pure parsers over the files' text; unit-tested on recorded files (tests/fixtures/cgroup).

/// Which cgroup hierarchy holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    V2,
}

impl Version {
    /// The file with the cgroup's total usage.
    #[must_use]
    pub const fn usage_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        }
    }

    /// The `memory.stat` key of the cache that the kernel reclaims first.
    #[must_use]
    pub const fn inactive_file_key(self) -> &'static str {
        match self {
            Version::V1 => "total_inactive_file",
            Version::V2 => "inactive_file",
        }
    }
}

/// Where the memory controller is mounted, given `/sys/fs/cgroup/cgroup.controllers` (None when
/// that file is absent): v2 when the unified hierarchy has the memory controller, else v1 at
/// `<root>/memory`.
#[must_use]
pub fn detect(unified_controllers: Option<&str>) -> Version {
    match unified_controllers {
        Some(c) if c.split_whitespace().any(|x| x == "memory") => Version::V2,
        _ => Version::V1,
    }
}

/// The memory cgroup's path (relative to the controller's mount) from `/proc/<pid>/cgroup`:
/// v1 lines are `id:controllers:path` with `memory` among the controllers, the v2 line is `0::path`.
#[must_use]
pub fn memory_path(proc_pid_cgroup: &str, version: Version) -> Option<&str> {
    proc_pid_cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = match version {
            Version::V2 => id == "0" && controllers.is_empty(),
            Version::V1 => controllers.split(',').any(|c| c == "memory"),
        };
        hit.then_some(path)
    })
}

/// One value of `memory.stat` (`key value` lines).
#[must_use]
pub fn stat_value(memory_stat: &[u8], key: &str) -> Option<u64> {
    memory_stat.split(|&b| b == b'\n').find_map(|l| {
        let rest = l.strip_prefix(key.as_bytes())?.strip_prefix(b" ")?;
        std::str::from_utf8(rest).ok()?.trim().parse().ok()
    })
}

/// A single number (`memory.current`, `memory.usage_in_bytes`).
#[must_use]
pub fn number(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text).ok()?.trim().parse().ok()
}

/// Charged memory: usage minus inactive file cache (never below zero).
#[must_use]
pub fn charged(version: Version, usage: &[u8], memory_stat: &[u8]) -> Option<u64> {
    let usage = number(usage)?;
    let inactive = stat_value(memory_stat, version.inactive_file_key()).unwrap_or(0);
    Some(usage.saturating_sub(inactive))
}

/// Pids of `cgroup.procs` into `out` (cleared first; no allocation beyond its capacity), sorted.
pub fn procs_into(text: &[u8], out: &mut Vec<i32>) {
    out.clear();
    for l in text.split(|&b| b == b'\n') {
        if out.len() == out.capacity() {
            break;
        }
        if let Some(p) = std::str::from_utf8(l).ok().and_then(|s| s.trim().parse::<i32>().ok()) {
            out.push(p);
        }
    }
    out.sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_CGROUP: &str = "9:name=systemd:/docker/3f1c\n8:pids:/docker/3f1c\n4:memory:/docker/3f1c\n0::/\n";
    const V2_CGROUP: &str = "0::/system.slice/docker-3f1c.scope\n";

    #[test]
    fn finds_the_memory_cgroup() {
        assert_eq!(memory_path(V1_CGROUP, Version::V1), Some("/docker/3f1c"));
        assert_eq!(memory_path(V2_CGROUP, Version::V2), Some("/system.slice/docker-3f1c.scope"));
        assert_eq!(memory_path(V2_CGROUP, Version::V1), None);
        assert_eq!(memory_path("4:cpu,memory:/a\n", Version::V1), Some("/a"));
        assert_eq!(detect(Some("cpuset cpu io memory pids\n")), Version::V2);
        assert_eq!(detect(Some("\n")), Version::V1);
        assert_eq!(detect(None), Version::V1);
    }

    #[test]
    fn charged_memory_leaves_out_inactive_cache() {
        let v1 = std::fs::read("tests/fixtures/cgroup/v1-memory.stat").unwrap();
        let usage = std::fs::read("tests/fixtures/cgroup/v1-memory.usage_in_bytes").unwrap();
        // A container that wrote a 200 MiB file: the cache is inactive, the charge is small.
        assert_eq!(stat_value(&v1, "total_inactive_file"), Some(209_715_200));
        assert_eq!(number(&usage), Some(216_592_384));
        assert_eq!(charged(Version::V1, &usage, &v1), Some(216_592_384 - 209_715_200));
        let v2 = std::fs::read("tests/fixtures/cgroup/v2-memory.stat").unwrap();
        assert_eq!(stat_value(&v2, "inactive_file"), Some(104_857_600));
        assert_eq!(stat_value(&v2, "anon"), Some(2_147_483_648));
        let current = std::fs::read("tests/fixtures/cgroup/v2-memory.current").unwrap();
        assert_eq!(charged(Version::V2, &current, &v2), Some(2_361_393_152 - 104_857_600));
        // More inactive cache than usage (racy reads): zero, not a wrap.
        assert_eq!(charged(Version::V2, b"1\n", &v2), Some(0));
        assert_eq!(charged(Version::V2, b"max\n", &v2), None);
        // A key that is a prefix of another is not confused with it.
        assert_eq!(stat_value(b"inactive_file_x 5\ninactive_file 7\n", "inactive_file"), Some(7));
    }

    #[test]
    fn members_sorted_within_capacity() {
        let mut v = Vec::with_capacity(3);
        procs_into(b"30\n10\n\n20\n40\n", &mut v);
        assert_eq!(v, [10, 20, 30]);
        procs_into(b"", &mut v);
        assert!(v.is_empty());
    }
}
