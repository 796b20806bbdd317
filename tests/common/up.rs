//! `spark-kit up --kit tiny-cpu` in the foreground for end-to-end tests: start it, wait until it
//! serves, stop it with SIGINT (as Ctrl-C would) and check its engine group is gone.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::{group_members, spark_kit};

/// Whether the end-to-end tests run (`tests/run-all.sh` sets SPARK_KIT_TEST_E2E after building
/// the engine venv); prints why not.
pub fn e2e_enabled() -> bool {
    if std::env::var_os("SPARK_KIT_TEST_E2E").is_some() {
        return true;
    }
    eprintln!("skipping: SPARK_KIT_TEST_E2E is not set (run `bash tests/run-all.sh`, which builds the engine venv)");
    false
}

/// True when `GET path` on 127.0.0.1:`port` answers 200.
pub fn http_ok(port: u16, path: &str) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.ends_with(b" 200")
}

/// A foreground `up` that is serving.
pub struct Serving {
    pub child: Child,
    /// What `up` printed on stdout until ready (the banner).
    pub stdout: Vec<String>,
    pub engine_pgid: i32,
    lines: std::sync::mpsc::Receiver<String>,
    stopped: bool,
}

impl Drop for Serving {
    /// A test that failed before `interrupt` still stops its server (SIGINT, then SIGKILL).
    fn drop(&mut self) {
        if self.stopped || matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `spark-kit up --kit tiny-cpu --port PORT --set paths.logs=LOGS EXTRA…`, until its "Ctrl-C
/// stops" banner or until `/v1/models` answers on the port (whichever comes first).
pub fn up_tiny_cpu(extra: &[&str], logs: &Path, port: u16, limit: Duration) -> Serving {
    let mut cmd = spark_kit();
    cmd.args(["up", "--kit", "tiny-cpu", "--port", &port.to_string()]);
    cmd.args(["--set", &format!("paths.logs={}", logs.display())]);
    cmd.args(extra).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().unwrap();
    // Keeps draining stdout after ready, so `up` never blocks on a full pipe.
    let rx = super::stdout_lines(&mut child);
    let deadline = Instant::now() + limit;
    let mut stdout = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => {
                let done = line.starts_with("Ctrl-C");
                stdout.push(line);
                if done {
                    break;
                }
            }
            Err(_) => {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("up exited before ready: {status}; stdout: {stdout:?}");
                }
                if http_ok(port, "/v1/models") {
                    break;
                }
                assert!(Instant::now() < deadline, "not ready in {limit:?}: {stdout:?}");
            }
        }
    }
    let engine_pgid = super::engine_pgid_under(child.id() as i32).expect("engine process under up");
    Serving { child, stdout, engine_pgid, lines: rx, stopped: false }
}

impl Serving {
    /// Wait (up to 60 s) for `up`'s ready banner, which follows the endpoint's first answers
    /// (readiness is `/health` plus a one-token completion); everything printed so far.
    pub fn banner(&mut self) -> &[String] {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.stdout.iter().any(|l| l.starts_with("Ctrl-C")) && Instant::now() < deadline {
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(500)) {
                self.stdout.push(line);
            }
        }
        &self.stdout
    }

    /// Send `sig` to `up` (the test then watches what follows; `wait_exit` reaps it).
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// Wait up to `limit` for `up` to exit; its exit status.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(t.elapsed() < limit, "up still running {limit:?} after the signal");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGINT to `up`; its engine group must be empty within 30 s and `up` must exit 130 (as
    /// shells expect of Ctrl-C).
    /// Returns the seconds until the group was gone.
    pub fn interrupt(mut self) -> f64 {
        self.stopped = true;
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        let t = Instant::now();
        while !group_members(self.engine_pgid).is_empty() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "engine group still alive 30 s after SIGINT: {:?}",
                group_members(self.engine_pgid)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let secs = t.elapsed().as_secs_f64();
        let status = self.child.wait().unwrap();
        assert_eq!(status.code(), Some(130), "up exit status {status}");
        secs
    }
}
