//! hf-xet's working directories: `<tmp>/spark-kit-xet-<pid>-<n>`, one per repo download,
//! removed when it ends. A run killed with `kill -9` cannot remove its own, so each run first
//! removes those whose pid is no longer a spark-kit process.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

const PREFIX: &str = "spark-kit-xet-";

/// A fresh working directory name for this process (not created).
#[must_use]
pub fn next_dir(tmp: &Path) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    tmp.join(format!("{PREFIX}{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)))
}

/// The pid in a working directory's name (`spark-kit-xet-<pid>-<n>`), if it is one.
#[must_use]
pub fn owner(name: &str) -> Option<u32> {
    let (pid, n) = name.strip_prefix(PREFIX)?.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// Whether `pid` is a live spark-kit process (a reused pid of another program is not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end().starts_with("spark-kit"))
}

/// Remove the working directories under `tmp` whose owner is gone; returns those removed.
pub fn remove_stale(tmp: &Path) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(tmp) else { return Vec::new() };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner(&name) else { continue };
        if pid != std::process::id() && !alive(pid) && std::fs::remove_dir_all(e.path()).is_ok() {
            out.push(e.path());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_owner() {
        let d = next_dir(Path::new("/t"));
        let name = d.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(owner(&name), Some(std::process::id()));
        assert_eq!(owner("spark-kit-xet-123-0"), Some(123));
        assert_eq!(owner("spark-kit-xet-123"), None);
        assert_eq!(owner("spark-kit-xet-abc-1"), None);
        assert_eq!(owner("other-123-1"), None);
    }

    #[test]
    fn only_dead_owners_lose_their_dirs() {
        let t = tempfile::tempdir().unwrap();
        // A pid above the kernel's pid_max (4194304) is never alive.
        let dead = t.path().join("spark-kit-xet-4194400-0");
        let mine = next_dir(t.path());
        let other = t.path().join("not-ours");
        for d in [&dead, &mine, &other] {
            std::fs::create_dir_all(d.join("x")).unwrap();
        }
        assert_eq!(remove_stale(t.path()), vec![dead.clone()]);
        assert!(!dead.exists() && mine.exists() && other.exists());
    }
}
