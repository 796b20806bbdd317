//! What died first inside an engine. vLLM's API server (the `__engine` process) exits 0 after
//! its EngineCore child crashed or was killed, so the engine's own exit status says nothing.
//! The engine process therefore watches its children: `waitid(WNOWAIT)` sees a child's
//! exit status without reaping it (vLLM's own `waitpid` still gets it), and each exit is written
//! to the engine log as one line ([`ChildExit::line`]). The node agent reads those lines back
//! ([`ChildExit::parse`]) and names the first abnormal one when the engine exits.

use std::fmt;

/// Prefix of the log line (the engine's stderr).
const PREFIX: &str = "spark-kit engine: child exited: ";

/// How a child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Code(i32),
    /// Killed by this signal number.
    Signal(i32),
}

/// One child of the engine process that exited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildExit {
    pub pid: i32,
    /// Its `comm` (e.g. `VLLM::EngineCor`, the kernel keeps 15 bytes).
    pub comm: String,
    pub ending: Ending,
}

fn signal_name(n: i32) -> String {
    nix::sys::signal::Signal::try_from(n).map_or_else(|_| format!("signal {n}"), |s| format!("signal {n} ({s})"))
}

impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Code(c) => write!(f, "exit code {c}"),
            Self::Signal(s) => write!(f, "killed by {}", signal_name(*s)),
        }
    }
}

impl ChildExit {
    /// Not a clean `exit(0)`.
    #[must_use]
    pub fn abnormal(&self) -> bool {
        self.ending != Ending::Code(0)
    }

    /// The log line: `spark-kit engine: child exited: pid=7 code=1 comm=VLLM::EngineCor`.
    #[must_use]
    pub fn line(&self) -> String {
        let how = match self.ending {
            Ending::Code(c) => format!("code={c}"),
            Ending::Signal(s) => format!("signal={s}"),
        };
        format!("{PREFIX}pid={} {how} comm={}", self.pid, self.comm)
    }

    /// Read a [`line`](Self::line) back from anywhere in a log line (tags before it are fine).
    #[must_use]
    pub fn parse(line: &str) -> Option<Self> {
        let rest = &line[line.find(PREFIX)? + PREFIX.len()..];
        // Another writer's line glued on (a write that was not whole) ends this one.
        let rest = rest.find(PREFIX).map_or(rest, |end| &rest[..end]);
        let mut parts = rest.splitn(3, ' ');
        let pid = parts.next()?.strip_prefix("pid=")?.parse().ok()?;
        let how = parts.next()?;
        let ending = if let Some(c) = how.strip_prefix("code=") {
            Ending::Code(c.parse().ok()?)
        } else {
            Ending::Signal(how.strip_prefix("signal=")?.parse().ok()?)
        };
        let comm = parts.next()?.strip_prefix("comm=")?.trim_end().to_string();
        Some(Self { pid, comm, ending })
    }
}

impl fmt::Display for ChildExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "its child pid {} ({}) {}", self.pid, self.comm, self.ending)
    }
}

/// How an engine's exit is described: its own status, then what died first, when a child
/// ended abnormally before it (`exit status: 0; first: its child pid 7 (VLLM::EngineCor) killed
/// by signal 9 (SIGKILL)`).
#[must_use]
pub fn describe(status: &str, children: &[ChildExit]) -> String {
    match children.iter().find(|c| c.abnormal()) {
        Some(c) => format!("{status}; first to die: {c}"),
        None => status.to_string(),
    }
}

/// This process's children (every thread's), from `/proc/self/task/*/children`.
fn children() -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| s.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<i32>>())
        .collect()
}

/// How child `pid` ended, if it has (its zombie is left for whoever started it to reap).
fn peek(pid: i32) -> Option<Ending> {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(nix::unistd::Pid::from_raw(pid)), flags) {
        Ok(WaitStatus::Exited(_, c)) => Some(Ending::Code(c)),
        Ok(WaitStatus::Signaled(_, s, _)) => Some(Ending::Signal(s as i32)),
        _ => None,
    }
}

/// Watch this process's children on a thread for as long as the process lives, calling `report`
/// once per child that exits (before it is reaped by whoever started it).
///
/// The thread blocks in `waitid(P_ALL, WEXITED | WNOWAIT)`, so it wakes the moment a child
/// dies, before vLLM's own monitor (a Python thread behind the GIL) can reap it. While an
/// already-reported zombie waits to be reaped, that call returns it again at once; the thread
/// then polls each child on its own (`waitid(P_PID, WNOHANG | WNOWAIT)`, every 20 ms), so a
/// zombie nobody reaps does not hide the exits after it.
pub fn watch(report: impl Fn(&ChildExit) + Send + 'static) {
    use nix::sys::wait::{waitid, Id, WaitPidFlag};
    std::thread::spawn(move || {
        let mut reported: std::collections::BTreeSet<i32> = std::collections::BTreeSet::new();
        let seen = |pid: i32, ending: Ending, reported: &mut std::collections::BTreeSet<i32>| {
            if reported.insert(pid) {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                report(&ChildExit { pid, comm: comm.trim().to_string(), ending });
            }
        };
        loop {
            let fresh = match waitid(Id::All, WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
                Ok(st) => {
                    st.pid().map(|p| p.as_raw()).filter(|p| !reported.contains(p)).and_then(|p| peek(p).map(|e| (p, e)))
                }
                Err(_) => None,
            };
            match fresh {
                Some((pid, ending)) => seen(pid, ending, &mut reported),
                None => {
                    // No child, or the next exited one is a reported zombie: poll each child.
                    let now = children();
                    reported.retain(|p| now.contains(p));
                    let fresh: Vec<i32> = now.into_iter().filter(|p| !reported.contains(p)).collect();
                    for pid in fresh {
                        if let Some(ending) = peek(pid) {
                            seen(pid, ending, &mut reported);
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_describe_names_the_first_abnormal_child() {
        let a = ChildExit { pid: 41, comm: "python3".into(), ending: Ending::Code(0) };
        let b = ChildExit { pid: 42, comm: "VLLM::EngineCor".into(), ending: Ending::Signal(9) };
        let c = ChildExit { pid: 43, comm: "a b".into(), ending: Ending::Code(3) };
        for x in [&a, &b, &c] {
            let tagged = format!("2026-12-03T10:00:00.000Z local/r0 err| {}", x.line());
            assert_eq!(ChildExit::parse(&tagged).as_ref(), Some(x));
        }
        assert_eq!(ChildExit::parse("INFO something else"), None);
        // Seen in a CI log: the native watcher's and the Python hook's lines for one child glued
        // into one (the newline written apart): the comm ends where the second line begins.
        let glued = format!("x err| {}{}", b.line(), b.line());
        assert_eq!(ChildExit::parse(&glued).as_ref(), Some(&b));
        assert_eq!(
            describe("exit status: 0", &[a.clone(), b, c]),
            "exit status: 0; first to die: its child pid 42 (VLLM::EngineCor) killed by signal 9 (SIGKILL)"
        );
        assert_eq!(describe("exit status: 0", &[a]), "exit status: 0");
        assert_eq!(Ending::Code(1).to_string(), "exit code 1");
    }

    #[test]
    fn a_killed_child_is_seen_before_it_is_reaped() {
        // A child of this test process, killed; the watcher reports it while the zombie waits,
        // and the test's own wait() still gets the status afterwards.
        let (tx, rx) = std::sync::mpsc::channel();
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        watch(move |c| {
            let _ = tx.send(c.clone());
        });
        child.kill().unwrap();
        let seen = loop {
            let c = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
            if c.pid == pid {
                break c;
            }
        };
        assert_eq!(seen.ending, Ending::Signal(9));
        assert_eq!(seen.comm, "sleep");
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9));
    }
}
