//! A command run to its end within a time limit, both of its pipes read while it runs: one that
//! writes more than a pipe holds (64 KiB) never blocks on a reader that waits for its exit, one
//! that does not answer in time is killed, and a process it leaves behind holding its output open
//! is waited for only within the same limit.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How a bounded run ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited within the limit; all of its output.
    Exited { status: ExitStatus, stdout: Vec<u8>, stderr: Vec<u8> },
    /// Still running at the limit: killed.
    Late,
    /// It exited, but a process it started kept its output open past the limit.
    HeldOpen,
}

/// Run `cmd` (stdin null, stdout and stderr piped) for at most `limit` (at least 1 ms).
pub fn run(cmd: &mut Command, limit: Duration) -> std::io::Result<Ended> {
    let deadline = Instant::now() + limit.max(Duration::from_millis(1));
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(Ended::Late);
            }
        }
    };
    let rest = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
    let Ok(stdout) = stdout.recv_timeout(rest()) else { return Ok(Ended::HeldOpen) };
    let Ok(stderr) = stderr.recv_timeout(rest()) else { return Ok(Ended::HeldOpen) };
    Ok(Ended::Exited { status, stdout, stderr })
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
    fn a_command_past_its_limit_is_killed() {
        let t = Instant::now();
        assert!(matches!(sh(1, "sleep 30"), Ended::Late));
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }

    #[test]
    fn output_held_open_by_a_process_left_behind_is_waited_for_within_the_limit_only() {
        // The shell exits at once; the background sleep keeps its stdout open for 4 s.
        let t = Instant::now();
        assert!(matches!(sh(1, "echo hi; sleep 4 &"), Ended::HeldOpen));
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        // Without one, a prompt exit is answered at once, with its status.
        let Ended::Exited { status, stdout, .. } = sh(1, "echo hi; exit 3") else { panic!("did not exit") };
        assert_eq!((status.code(), stdout.as_slice()), (Some(3), b"hi\n".as_slice()));
    }

    #[test]
    fn a_missing_program_is_the_spawn_error() {
        let e = run(&mut Command::new("/nonexistent/spark-kit-bounded"), Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }
}
