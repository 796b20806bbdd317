//! The engine as a child process: its own process group, oom_score_adj 1000, dies with its
//! parent; stdout/stderr go to a log file (and, tagged, to a sink when asked); stopping it means
//! stopping the whole group: SIGTERM, a drain window, SIGKILL, then a check from /proc.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::pgroup::{members, Stat};

/// Receives each engine output line (for `--verbose` and the hang detector).
pub type LineSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How to start one engine process.
#[derive(Clone)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Added to a minimal base environment (PATH, HOME, LANG, TERM, USER, TMPDIR).
    pub env: BTreeMap<String, String>,
    pub log: PathBuf,
    /// Tag written before every line in the log: node and rank(s), e.g. `node-b/r1`.
    pub tag: String,
    pub sink: Option<LineSink>,
}

/// A running engine and the group it leads.
pub struct Engine {
    child: Child,
    pub pgid: i32,
    pub log: PathBuf,
    pumps: Vec<thread::JoinHandle<()>>,
    /// The pumps were given their time to finish after the exit (once).
    drained: bool,
}

/// Errors starting the engine.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot open the engine log {path}: {source}")]
    Log { path: PathBuf, source: std::io::Error },
    #[error("cannot start the engine {program}: {source}")]
    Start { program: PathBuf, source: std::io::Error },
}

const BASE_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TERM", "USER", "LOGNAME", "TMPDIR"];

/// Start the engine described by `launch`. `base_env` is the caller's environment, from which
/// only [`BASE_ENV`] names are passed on.
pub fn spawn(launch: &Launch, base_env: &[(String, String)]) -> Result<Engine, SpawnError> {
    if let Some(dir) = launch.log.parent() {
        fs::create_dir_all(dir).map_err(|source| SpawnError::Log { path: launch.log.clone(), source })?;
    }
    let log = RotatingLog::open(&launch.log, LOG_ROTATE_BYTES, LOG_KEEP)
        .map_err(|source| SpawnError::Log { path: launch.log.clone(), source })?;
    let mut cmd = Command::new(&launch.program);
    cmd.args(&launch.args).env_clear().stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in base_env.iter().filter(|(k, _)| BASE_ENV.contains(&k.as_str())) {
        cmd.env(k, v);
    }
    cmd.envs(&launch.env);
    cmd.process_group(0);
    // SAFETY: runs between fork and exec; prctl and signal(2) are async-signal-safe and touch no
    // Rust state.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)?;
            // The agent ignores SIGINT; the engine (vLLM) gets the default disposition back.
            nix::sys::signal::signal(Signal::SIGINT, nix::sys::signal::SigHandler::SigDfl)
                .map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| SpawnError::Start { program: launch.program.clone(), source })?;
    let pgid = i32::try_from(child.id()).unwrap_or(i32::MAX);
    let log = Arc::new(Mutex::new(log));
    let mut pumps = Vec::new();
    if let Some(out) = child.stdout.take() {
        pumps.push(pump(out, format!("{} out", launch.tag), Arc::clone(&log), launch.sink.clone()));
    }
    if let Some(err) = child.stderr.take() {
        pumps.push(pump(err, format!("{} err", launch.tag), Arc::clone(&log), launch.sink.clone()));
    }
    Ok(Engine { child, pgid, log: launch.log.clone(), pumps, drained: false })
}

/// Engine logs rotate at this size…
pub const LOG_ROTATE_BYTES: u64 = 64 << 20;
/// …keeping this many old files (`<log>.1` … `<log>.N`).
pub const LOG_KEEP: u32 = 3;

/// An append-only log file that rotates by size: `log` → `log.1` → … → `log.N` (dropped).
pub struct RotatingLog {
    path: PathBuf,
    file: fs::File,
    size: u64,
    limit: u64,
    keep: u32,
}

impl RotatingLog {
    pub fn open(path: &Path, limit: u64, keep: u32) -> std::io::Result<Self> {
        let file = fs::OpenOptions::new().create(true).append(true).open(path)?;
        let size = file.metadata()?.len();
        Ok(Self { path: path.to_path_buf(), file, size, limit, keep })
    }

    fn rotated(&self, n: u32) -> PathBuf {
        PathBuf::from(format!("{}.{n}", self.path.display()))
    }

    /// Append `bytes`, rotating first when they would cross the limit.
    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.size > 0 && self.size + bytes.len() as u64 > self.limit {
            for n in (1..self.keep).rev() {
                let _ = fs::rename(self.rotated(n), self.rotated(n + 1));
            }
            if self.keep > 0 {
                fs::rename(&self.path, self.rotated(1))?;
            } else {
                fs::remove_file(&self.path)?;
            }
            self.file = fs::OpenOptions::new().create(true).append(true).open(&self.path)?;
            self.size = 0;
        }
        self.file.write_all(bytes)?;
        self.size += bytes.len() as u64;
        Ok(())
    }
}

/// One log line as written to the file: `<UTC time> <node>/r<rank> <out|err>| <line>`.
#[must_use]
pub fn tagged(time: &str, tag: &str, line: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(line.len() + tag.len() + 32);
    v.extend_from_slice(time.as_bytes());
    v.push(b' ');
    v.extend_from_slice(tag.as_bytes());
    v.extend_from_slice(b"| ");
    v.extend_from_slice(line);
    if !line.ends_with(b"\n") {
        v.push(b'\n');
    }
    v
}

/// The engine's own text of a tagged log line (the line itself when it has no tag).
#[must_use]
pub fn untagged(line: &str) -> &str {
    line.split_once("| ").filter(|(head, _)| head.ends_with(" out") || head.ends_with(" err")).map_or(line, |(_, l)| l)
}

fn pump(
    stream: impl Read + Send + 'static,
    tag: String,
    log: Arc<Mutex<RotatingLog>>,
    sink: Option<LineSink>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = tagged(&crate::clock::now_rfc3339(), &tag, &buf);
                    if let Ok(mut f) = log.lock() {
                        let _ = f.write(&line);
                    }
                    if let Some(s) = &sink {
                        s(String::from_utf8_lossy(&buf).trim_end());
                    }
                }
            }
        }
    })
}

/// What stopping the group found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StopReport {
    /// The group emptied after SIGTERM alone.
    pub graceful: bool,
    pub seconds: f64,
    /// Processes still in the group at the end (must be empty).
    pub survivors: Vec<String>,
}

impl Engine {
    /// The engine's exit status, if it has exited. Its last output lines are read first (up to
    /// 2 s for the log pumps to reach the end of the pipes), so whatever looks at the log or the
    /// sink next sees everything the engine wrote before it died (e.g. which child died first).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let status = self.child.try_wait().ok().flatten()?;
        let until = Instant::now() + Duration::from_secs(2);
        while !self.drained && self.pumps.iter().any(|p| !p.is_finished()) && Instant::now() < until {
            thread::sleep(Duration::from_millis(10));
        }
        self.drained = true;
        Some(status)
    }

    /// The process id of the engine (the group leader).
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM the engine (vLLM then shuts its EngineCore and workers down in order), wait up to
    /// `drain` for the whole group to empty, then SIGKILL the group and wait up to ten more
    /// seconds; report what (if anything) survived.
    pub fn stop(&mut self, drain: Duration) -> StopReport {
        let started = Instant::now();
        let pg = Pid::from_raw(self.pgid);
        // Signalling every process of the group at once makes EngineCore see two shutdowns
        // (and log an EngineDeadError); the leader alone shuts down just as fast, cleanly.
        let _ = nix::sys::signal::kill(pg, Signal::SIGTERM);
        let graceful = self.wait_empty(drain);
        if !graceful {
            let _ = killpg(pg, Signal::SIGKILL);
            self.wait_empty(Duration::from_secs(10));
        }
        let _ = self.child.wait();
        for p in self.pumps.drain(..) {
            let _ = p.join();
        }
        let survivors = members(self.pgid).into_iter().map(|s: Stat| format!("{} ({})", s.pid, s.comm)).collect();
        StopReport { graceful, seconds: started.elapsed().as_secs_f64(), survivors }
    }

    fn wait_empty(&mut self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            let _ = self.child.try_wait();
            if members(self.pgid).is_empty() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// The log's last `n` lines.
    #[must_use]
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.log, n)
    }
}

/// The last `n` lines of a file, empty when it cannot be read (for error messages).
#[must_use]
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Path of a node's engine log.
#[must_use]
pub fn log_path(logs: &Path, kit: &str, node: &str) -> PathBuf {
    logs.join(format!("{kit}-{node}-engine.log"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_tagged_with_time_node_rank_and_stream() {
        let l = tagged("2026-12-02T16:21:03.123Z", "node-b/r1 err", b"(Worker pid=7) INFO ready\n");
        let s = String::from_utf8(l).unwrap();
        assert_eq!(s, "2026-12-02T16:21:03.123Z node-b/r1 err| (Worker pid=7) INFO ready\n");
        assert_eq!(untagged(s.trim_end()), "(Worker pid=7) INFO ready");
        assert_eq!(untagged("plain | text"), "plain | text");
        assert!(tagged("t", "a/r0 out", b"no newline").ends_with(b"no newline\n"));
    }

    #[test]
    fn log_rotates_by_size_and_keeps_n() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("e.log");
        let mut log = RotatingLog::open(&p, 10, 2).unwrap();
        for i in 0..5 {
            log.write(format!("line {i}\n").as_bytes()).unwrap(); // 7 bytes each
        }
        assert_eq!(fs::read_to_string(&p).unwrap(), "line 4\n");
        assert_eq!(fs::read_to_string(d.path().join("e.log.1")).unwrap(), "line 3\n");
        assert_eq!(fs::read_to_string(d.path().join("e.log.2")).unwrap(), "line 2\n");
        assert!(!d.path().join("e.log.3").exists());
    }
}
