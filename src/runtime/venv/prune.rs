//! Old engine venvs: when a kit's requirements (or spark-kit's recipe) change, `setup` builds a
//! new venv under a new key and the old one (several GiB) would stay forever. After the current
//! venv is ready, `setup` removes the other venvs of the same requirement set that no process is
//! using and that no other `setup` is building (their lock is free). Names are pure; removal is I/O.

use std::fs;
use std::path::{Path, PathBuf};

/// Whether `file_name` is a venv directory of the requirement set `set` (`<set>-<16 hex>`).
#[must_use]
pub fn is_venv_of(file_name: &str, set: &str) -> bool {
    file_name
        .strip_prefix(set)
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|key| key.len() == 16 && key.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A removed (or kept) old venv.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Pruned {
    pub path: PathBuf,
    pub bytes: u64,
    /// `None`: removed; `Some(why)`: kept.
    pub kept: Option<String>,
}

/// Bytes under `dir` (files only, links not followed).
fn size(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// A process whose executable or command line is inside `dir`, if any.
fn user_of(dir: &Path) -> Option<i32> {
    let needle = dir.to_string_lossy().into_owned();
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_string_lossy().parse().ok()?;
        let exe = fs::read_link(e.path().join("exe")).ok().is_some_and(|p| p.starts_with(dir));
        let cmd = fs::read(e.path().join("cmdline"))
            .ok()
            .is_some_and(|c| String::from_utf8_lossy(&c).split('\0').any(|a| a.contains(&needle)));
        (exe || cmd).then_some(pid)
    })
}

/// Remove the venvs of `set` under `root` other than `keep`.
#[must_use]
pub fn prune(root: &Path, set: &str, keep: &Path) -> Vec<Pruned> {
    let Ok(entries) = fs::read_dir(root) else { return Vec::new() };
    let mut old: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| is_venv_of(&e.file_name().to_string_lossy(), set))
        .map(|e| e.path())
        .filter(|p| p != keep)
        .collect();
    old.sort();
    old.into_iter().map(|dir| remove(&dir)).collect()
}

fn remove(dir: &Path) -> Pruned {
    let bytes = size(dir);
    let kept = |why: String| Pruned { path: dir.to_path_buf(), bytes, kept: Some(why) };
    if let Some(pid) = user_of(dir) {
        return kept(format!("in use by pid {pid}"));
    }
    let lock_path = dir.with_extension("lock");
    let lock = fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path);
    let Ok(lock) = lock else { return kept(format!("cannot open {}", lock_path.display())) };
    let Ok(_held) = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock) else {
        return kept("another setup holds its lock".into());
    };
    if let Err(e) = fs::remove_dir_all(dir) {
        return kept(format!("cannot remove: {e}"));
    }
    for ext in ["log", "installer.txt", "requirements.txt", "lock"] {
        let _ = fs::remove_file(dir.with_extension(ext));
    }
    Pruned { path: dir.to_path_buf(), bytes, kept: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_a_set() {
        assert!(is_venv_of("engine-tiny-cpu-6516bfd3ae3d72f7", "engine-tiny-cpu"));
        assert!(!is_venv_of("engine-tiny-cpu-6516bfd3ae3d72f7.log", "engine-tiny-cpu"));
        assert!(!is_venv_of("engine-tiny-cpu-gpu-6516bfd3ae3d72f7", "engine-tiny-cpu"));
        assert!(!is_venv_of("engine-tiny-6516bfd3ae3d72f7", "engine-tiny-cpu"));
    }

    #[test]
    fn removes_old_venvs_but_not_the_current_one_or_one_in_use() {
        let d = tempfile::tempdir().unwrap();
        let mk = |key: &str| {
            let p = d.path().join(format!("engine-x-{key}"));
            fs::create_dir_all(p.join("bin")).unwrap();
            fs::write(p.join("bin/python"), vec![0u8; 100]).unwrap();
            fs::write(p.with_extension("log"), "log").unwrap();
            p
        };
        let current = mk("aaaaaaaaaaaaaaaa");
        let old = mk("bbbbbbbbbbbbbbbb");
        let busy = mk("cccccccccccccccc");
        fs::create_dir_all(d.path().join("engine-y-dddddddddddddddd")).unwrap();
        // A process running with the busy venv on its command line.
        let mut child =
            std::process::Command::new("sh").args(["-c", "sleep 30", busy.to_str().unwrap()]).spawn().unwrap();
        let r = prune(d.path(), "engine-x", &current);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[0].path, old);
        assert!(r[0].kept.is_none() && r[0].bytes == 100, "{r:?}");
        assert!(!old.exists() && !old.with_extension("log").exists());
        assert!(r[1].kept.as_deref().unwrap_or_default().starts_with("in use by pid"), "{r:?}");
        assert!(current.exists() && busy.exists() && d.path().join("engine-y-dddddddddddddddd").exists());
    }
}
