//! The control socket of a running supervisor (`<logs>/<kit>.sock`): `status` and `down` talk to
//! it. One request line in, one JSON line out.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::snapshot::{Handles, Snapshot};
use super::state::State;

/// `down` requests still waiting for their answer; the supervisor lets them finish before it
/// exits, so `down` always gets the final snapshot.
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Wait (at most `limit`) until every `down` request has been answered.
pub fn wait_answered(limit: Duration) {
    let until = Instant::now() + limit;
    while PENDING.load(Ordering::SeqCst) > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Paths of a kit's runtime files.
#[must_use]
pub fn socket_path(logs: &Path, kit: &str) -> PathBuf {
    logs.join(format!("{kit}.sock"))
}

/// The supervisor's pid file.
#[must_use]
pub fn pid_path(logs: &Path, kit: &str) -> PathBuf {
    logs.join(format!("{kit}.pid"))
}

/// Serve `status` and `down` on `path` until the process exits (runs on its own thread).
pub fn serve(path: &Path, h: Handles) -> std::io::Result<()> {
    if path.exists() {
        // A stale socket of a dead supervisor (the caller checked that none answers).
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let h = h.clone();
            std::thread::spawn(move || answer(conn, &h));
        }
    });
    Ok(())
}

fn snapshot_json(h: &Handles) -> String {
    h.current().and_then(|s| serde_json::to_string(&s).ok()).unwrap_or_else(|| "{}".into())
}

fn answer(conn: UnixStream, h: &Handles) {
    let mut reader = BufReader::new(&conn);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut w = &conn;
    match line.trim() {
        "status" => {
            let _ = writeln!(w, "{}", snapshot_json(h));
        }
        "down" => {
            PENDING.fetch_add(1, Ordering::SeqCst);
            h.stop.store(true, Ordering::SeqCst);
            // Answer once stopped (the process keeps serving this thread until it exits).
            let deadline = Instant::now() + Duration::from_secs(600);
            while Instant::now() < deadline {
                let done = h.snapshot.lock().map(|s| matches!(s.state, State::Stopped | State::Failed)).unwrap_or(true);
                if done {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            let _ = writeln!(w, "{}", snapshot_json(h));
            let _ = w.flush();
            PENDING.fetch_sub(1, Ordering::SeqCst);
        }
        other => {
            let _ = writeln!(w, "{{\"error\":\"unknown request {other:?}\"}}");
        }
    }
}

/// Why a request to a supervisor failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no spark-kit deployment of kit `{kit}` is running here (no answer on {path})")]
    NotRunning { kit: String, path: String },
    #[error("the supervisor answered something unreadable: {0}")]
    Garbled(String),
}

/// Send one request; `None` timeout waits as long as the supervisor takes.
pub fn request(path: &Path, kit: &str, what: &str, timeout: Option<Duration>) -> Result<Snapshot, ControlError> {
    let not_running = || ControlError::NotRunning { kit: kit.into(), path: path.display().to_string() };
    let mut s = UnixStream::connect(path).map_err(|_| not_running())?;
    s.set_read_timeout(timeout).map_err(|_| not_running())?;
    writeln!(s, "{what}").map_err(|_| not_running())?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(|e| ControlError::Garbled(e.to_string()))?;
    serde_json::from_str(&line).map_err(|e| ControlError::Garbled(format!("{e}: {line}")))
}
