//! A command run to its end within a time limit, both of its pipes read while it runs: one that
//! writes more than a pipe holds (64 KiB) never blocks on a reader that waits for its exit, one
//! that does not answer in time is killed with its whole process group (it runs in a group of its
//! own: nothing it started outlives it) and what it wrote so far is kept, and a process it left
//! behind holding its output open is waited for only within the same limit, then killed. Being in
//! a group of its own, a terminal's Ctrl-C does not reach it: it dies with this process instead
//! (PDEATHSIG), so an interrupted spark-kit leaves no command of it running.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// How a bounded run ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited within the limit; all of its output.
    Exited { status: ExitStatus, stdout: Vec<u8>, stderr: Vec<u8> },
    /// Still running at the limit: its process group killed; what it had written by then.
    Late { stdout: Vec<u8>, stderr: Vec<u8> },
    /// It exited, but a process it started kept its output open past the limit.
    HeldOpen,
}

/// Run `cmd` (stdin null, stdout and stderr piped, a process group of its own) for at most
/// `limit` (at least 1 ms).
pub fn run(cmd: &mut Command, limit: Duration) -> std::io::Result<Ended> {
    let deadline = Instant::now() + limit.max(Duration::from_millis(1));
    run_until(cmd, &mut || Instant::now() >= deadline)
}

/// Run `cmd` as [`run`] does until it ends or `stop` (asked every 20 ms, and between waits for
/// its output after it exits) says to end it: then as past a limit ([`Ended::Late`], or
/// [`Ended::HeldOpen`] once it has exited). `stop` may take its time: the pipes are read on
/// threads of their own meanwhile.
pub fn run_until(cmd: &mut Command, stop: &mut dyn FnMut() -> bool) -> std::io::Result<Ended> {
    // Its own process group keeps it out of a terminal's Ctrl-C, so it must die with its starter: PDEATHSIG
    // (the thread that spawns it waits here for its end), checked against a parent already gone.
    let parent = nix::unistd::getpid();
    // SAFETY: runs between fork and exec; prctl and getppid are async-signal-safe and touch no Rust state.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            if nix::unistd::getppid() == parent {
                Ok(())
            } else {
                Err(std::io::Error::other("its starter is gone"))
            }
        });
    }
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).spawn()?;
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    // The group's id is the child's pid (process_group(0)).
    let group = i32::try_from(child.id()).ok().map(Pid::from_raw);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if !stop() => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                kill_group(group);
                let _ = child.kill();
                let _ = child.wait();
                let grace = Duration::from_secs(1);
                let (stdout, stderr) = (stdout.recv_timeout(grace), stderr.recv_timeout(grace));
                return Ok(Ended::Late { stdout: stdout.unwrap_or_default(), stderr: stderr.unwrap_or_default() });
            }
        }
    };
    match (collect(&stdout, stop), collect(&stderr, stop)) {
        (Some(stdout), Some(stderr)) => Ok(Ended::Exited { status, stdout, stderr }),
        _ => {
            // What holds the output open is still in the group (the group outlives its leader).
            kill_group(group);
            Ok(Ended::HeldOpen)
        }
    }
}

/// A drained pipe's bytes, waited for until `stop` says to give up (one 100 ms wait at least).
fn collect(pipe: &mpsc::Receiver<Vec<u8>>, stop: &mut dyn FnMut() -> bool) -> Option<Vec<u8>> {
    loop {
        match pipe.recv_timeout(Duration::from_millis(100)) {
            Ok(all) => return Some(all),
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            Err(mpsc::RecvTimeoutError::Timeout) if stop() => return None,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

fn kill_group(group: Option<Pid>) {
    if let Some(g) = group {
        let _ = killpg(g, Signal::SIGKILL);
    }
}

/// All of a pipe, read on a thread of its own, sent once it closes (nothing for no pipe).
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    match pipe {
        Some(mut r) => {
            std::thread::spawn(move || {
                let mut all = Vec::new();
                let _ = r.read_to_end(&mut all);
                let _ = tx.send(all);
            });
        }
        None => {
            let _ = tx.send(Vec::new());
        }
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(limit_s: u64, script: &str) -> Ended {
        run(Command::new("sh").args(["-c", script]), Duration::from_secs(limit_s)).unwrap()
    }

    #[test]
    fn output_beyond_a_pipe_buffer_comes_back_whole_on_both_pipes() {
        // 1 MiB on stdout and 200 KiB on stderr: more than a pipe holds, both at once.
        let Ended::Exited { status, stdout, stderr } =
            sh(20, "head -c 204800 /dev/zero >&2; head -c 1048576 /dev/zero | tr '\\0' x")
        else {
            panic!("did not exit")
        };
        assert!(status.success());
        assert_eq!((stdout.len(), stderr.len()), (1_048_576, 204_800));
        assert!(stdout.iter().all(|b| *b == b'x'));
    }

    #[test]
    fn a_command_past_its_limit_is_killed_with_what_it_started_and_its_output_so_far_kept() {
        let t = Instant::now();
        let Ended::Late { stdout, .. } = sh(1, "sleep 30 & echo $!; echo first; wait") else { panic!("not late") };
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        let text = String::from_utf8(stdout).unwrap();
        let mut lines = text.lines();
        let sleeper: i32 = lines.next().unwrap().parse().unwrap();
        assert_eq!(lines.next(), Some("first"));
        gone(sleeper);
    }

    /// `pid` ends within 5 s: gone, or a zombie its new parent has yet to reap.
    fn gone(pid: i32) {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
            match state.as_deref().and_then(|s| s.rsplit_once(") ")).and_then(|(_, r)| r.chars().next()) {
                None | Some('Z' | 'X') => break,
                Some(c) => assert!(Instant::now() < until, "the sleep it started outlived it (state {c})"),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn output_held_open_by_a_process_left_behind_is_waited_for_within_the_limit_only() {
        // The shell exits at once; the background sleep keeps its stdout open, and is killed.
        let t = Instant::now();
        let pid_file = tempfile::NamedTempFile::new().unwrap();
        let script = format!("echo hi; sleep 30 & echo $! > {}", pid_file.path().display());
        assert!(matches!(sh(1, &script), Ended::HeldOpen));
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        let sleeper: i32 = std::fs::read_to_string(pid_file.path()).unwrap().trim().parse().unwrap();
        gone(sleeper);
        // Without one, a prompt exit is answered at once, with its status.
        let Ended::Exited { status, stdout, .. } = sh(1, "echo hi; exit 3") else { panic!("did not exit") };
        assert_eq!((status.code(), stdout.as_slice()), (Some(3), b"hi\n".as_slice()));
    }

    #[test]
    fn a_command_dies_with_the_thread_waiting_for_it() {
        // The waiting thread ends abruptly (a panic out of the stop check), as spark-kit ends on a
        // Ctrl-C: the command, in a process group of its own, must not outlive it.
        let pid_file = tempfile::NamedTempFile::new().unwrap();
        let path = pid_file.path().to_path_buf();
        let waiter = std::thread::spawn(move || {
            let script = format!("echo $$ > {}; exec sleep 30", path.display());
            let _ = run_until(Command::new("sh").args(["-c", &script]), &mut || {
                let written = std::fs::read_to_string(&path).is_ok_and(|t| t.ends_with('\n'));
                assert!(!written, "the waiting thread ends here");
                false
            });
        });
        assert!(waiter.join().is_err());
        let pid: i32 = std::fs::read_to_string(pid_file.path()).unwrap().trim().parse().unwrap();
        gone(pid);
    }

    #[test]
    fn a_missing_program_is_the_spawn_error() {
        let e = run(&mut Command::new("/nonexistent/spark-kit-bounded"), Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }
}
