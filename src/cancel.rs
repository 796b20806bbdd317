//! Cancelling long work from another thread. The work starts its child processes through
//! [`Cancel::spawn`], each the leader of a process group of its own; [`Cancel::cancel`] kills
//! every such group at once (SIGKILL, grandchildren included), so the work's wait for its child
//! ends and the work returns, and every later spawn fails. Polling is left to what cannot be
//! killed (a lock wait asks [`Cancel::is_cancelled`]). Each group also holds a keeper: a shell
//! in the group that waits on a pipe only this process can write to and kills the group when it
//! reads end-of-file, so a SIGKILLed owner (no cancel, no drop) still takes the group's
//! grandchildren along (PDEATHSIG reaches only the leader). A leaf module: it imports nothing of
//! the crate.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// A cancel token: clones share it. The default is not cancelled (and, when no one holds a
/// clone to cancel it, never will be).
#[derive(Clone, Default)]
pub struct Cancel(Arc<Mutex<Inner>>);

#[derive(Default)]
struct Inner {
    cancelled: bool,
    /// The process groups started through this token that are still running.
    groups: BTreeSet<i32>,
}

impl Cancel {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        // The set stays consistent whatever panicked while holding it.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cancel: kill every running group started through this token and refuse new ones.
    pub fn cancel(&self) {
        let mut inner = self.inner();
        inner.cancelled = true;
        for g in &inner.groups {
            let _ = killpg(Pid::from_raw(*g), Signal::SIGKILL);
        }
    }

    /// Whether [`Cancel::cancel`] was called.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.inner().cancelled
    }

    /// Start `cmd` as the leader of a new process group, killed when this token is cancelled
    /// (an `Interrupted` error, nothing started, when it already is) or when the thread that
    /// started it ends (PDEATHSIG), or, grandchildren included, when this process dies (the
    /// group's keeper). The group lives until the returned [`Group`] drops.
    pub fn spawn(&self, cmd: &mut Command) -> io::Result<Group> {
        let mut inner = self.inner();
        if inner.cancelled {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "cancelled"));
        }
        cmd.process_group(0);
        // SAFETY: runs between fork and exec; prctl is async-signal-safe and touches no Rust state.
        unsafe {
            cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from));
        }
        let child = cmd.spawn()?;
        // A pid fits in an i32 (pid_max is at most 2^22).
        let pgid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        inner.groups.insert(pgid);
        let mut group = Group { child, pgid, cancel: self.clone(), keeper: None };
        drop(inner);
        group.keeper = Some(keeper(pgid).inspect_err(|_| group.kill())?);
        Ok(group)
    }
}

/// The keeper of group `pgid`: `sh` in that group reading a pipe whose only writer is this
/// process (close-on-exec: no child inherits it); end-of-file, when the returned writer drops or
/// this process dies, makes it kill its group.
fn keeper(pgid: i32) -> io::Result<(Child, OwnedFd)> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let child = Command::new("sh")
        .args(["-c", "read -r line; kill -KILL 0"])
        .stdin(Stdio::from(read))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(pgid)
        .spawn()?;
    Ok((child, write))
}

/// A child started by [`Cancel::spawn`] and its process group. Dropping it kills what is left
/// of the group (the group ends with the work that waited for it) and reaps the child.
pub struct Group {
    pub child: Child,
    pgid: i32,
    cancel: Cancel,
    /// The group's keeper and the pipe it waits on.
    keeper: Option<(Child, OwnedFd)>,
}

impl Group {
    fn kill(&mut self) {
        let mut inner = self.cancel.inner();
        inner.groups.remove(&self.pgid);
        let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
        drop(inner);
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some((mut keeper, pipe)) = self.keeper.take() {
            drop(pipe);
            let _ = keeper.kill();
            let _ = keeper.wait();
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Tests: the pid a script wrote to `path`, waited for up to `within` (None: never written).
#[cfg(test)]
pub(crate) fn pid_from_file(path: &std::path::Path, within: std::time::Duration) -> Option<i32> {
    let t = std::time::Instant::now();
    loop {
        if let Some(p) = std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse::<i32>().ok()) {
            return Some(p);
        }
        if t.elapsed() >= within {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    }

    /// A script started through `cancel` with a `sleep` in the background; its group and the sleep's pid.
    fn script_with_grandchild(cancel: &Cancel) -> (Group, i32) {
        let d = tempfile::tempdir().unwrap();
        let pid_file = d.path().join("grandchild");
        let script = format!("sleep 60 & echo $! > {}; wait", pid_file.display());
        let g = cancel.spawn(Command::new("sh").args(["-c", &script])).unwrap();
        let grandchild = pid_from_file(&pid_file, Duration::from_secs(10)).expect("the script did not start");
        assert!(alive(grandchild));
        (g, grandchild)
    }

    #[test]
    fn cancel_kills_the_group_grandchildren_included_and_refuses_new_work() {
        let cancel = Cancel::default();
        let (mut g, grandchild) = script_with_grandchild(&cancel);
        let other = cancel.clone();
        std::thread::spawn(move || other.cancel()).join().unwrap();
        let status = g.child.wait().unwrap();
        assert!(!status.success(), "{status}");
        let t = Instant::now();
        while alive(grandchild) {
            assert!(t.elapsed() < Duration::from_secs(2), "the grandchild {grandchild} survived");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(cancel.is_cancelled());
        let e = cancel.spawn(&mut Command::new("true")).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::Interrupted);
    }

    #[test]
    fn the_keeper_kills_the_group_when_its_pipe_closes_as_when_the_owner_dies() {
        let cancel = Cancel::default();
        let (mut g, grandchild) = script_with_grandchild(&cancel);
        let (mut keeper, pipe) = g.keeper.take().unwrap();
        let keeper_pid = i32::try_from(keeper.id()).unwrap();
        assert_eq!(nix::unistd::getpgid(Some(Pid::from_raw(keeper_pid))).unwrap().as_raw(), g.pgid);
        // What the kernel does to this process's end of the pipe when it is SIGKILLed: close it.
        drop(pipe);
        let t = Instant::now();
        while alive(grandchild) {
            assert!(t.elapsed() < Duration::from_secs(2), "the grandchild {grandchild} outlived its keeper's pipe");
            std::thread::sleep(Duration::from_millis(20));
        }
        let status = g.child.wait().unwrap();
        assert!(!status.success(), "{status}");
        assert!(!keeper.wait().unwrap().success(), "the keeper killed its own group, itself included");
    }

    #[test]
    fn finished_work_leaves_the_token_as_it_was() {
        let cancel = Cancel::default();
        let mut g = cancel.spawn(&mut Command::new("true")).unwrap();
        assert!(g.child.wait().unwrap().success());
        drop(g);
        assert!(cancel.inner().groups.is_empty());
        assert!(!cancel.is_cancelled());
    }
}
