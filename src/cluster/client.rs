//! The supervisor side of a node agent: start `spark-kit node` on a node (pushing the binary
//! there first when needed), forward its events to a channel, send it commands, close it.
//! Used by the supervisor's one spawn path (`supervisor::agents`), which receives what it sends.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use super::protocol::{decode, encode, Command, Event};
use super::{push, transport};
use crate::kit::schema::Node;

/// What arrives from agent number `i`.
pub enum Msg {
    Event(usize, Event),
    /// Its stdout closed: the agent (or the connection to it) is gone.
    Lost(usize),
}

/// Why an agent could not be started.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Push(#[from] push::PushError),
    #[error("cannot start the agent for node {node}: {why}")]
    Start { node: String, why: String },
}

/// Why an answer from an agent did not come.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// The agent reported an error instead (its own words).
    #[error("{0}")]
    Agent(String),
    #[error("the agent's connection closed")]
    Closed,
    #[error("no answer within {0} s")]
    Timeout(u64),
}

/// A running agent process (local, or the ssh / exec client that carries it).
pub struct AgentProc {
    pub child: Child,
    stdin: Option<ChildStdin>,
}

/// Start the agent of `node` (index `i`, first rank `rank`); its stderr is appended to `log`,
/// its events go to `tx` (as the listener's own message type, made from [`Msg`]).
pub fn spawn<T: From<Msg> + Send + 'static>(
    node: &Node,
    i: usize,
    rank: usize,
    exe: &Path,
    sha: &str,
    log: &Path,
    tx: Sender<T>,
) -> Result<AgentProc, AgentError> {
    let bin = push::ensure(node, exe, sha)?;
    let argv = vec![bin, "node".to_string(), "--rank".into(), rank.to_string()];
    let start_err = |why: String| AgentError::Start { node: node.name.clone(), why };
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).map_err(|e| start_err(format!("{}: {e}", dir.display())))?;
    }
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| start_err(format!("{}: {e}", log.display())))?;
    let mut child = transport::command(node, &argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .map_err(|e| start_err(e.to_string()))?;
    let stdout = child.stdout.take();
    let stdin = child.stdin.take();
    std::thread::spawn(move || {
        if let Some(out) = stdout {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(ev) = decode::<Event>(&line) {
                    if tx.send(Msg::Event(i, ev).into()).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tx.send(Msg::Lost(i).into());
    });
    Ok(AgentProc { child, stdin })
}

impl AgentProc {
    /// Send one command; false when the agent's stdin is closed or broken.
    pub fn send(&mut self, cmd: &Command) -> bool {
        let Some(stdin) = self.stdin.as_mut() else { return false };
        match encode(cmd) {
            Ok(line) => writeln!(stdin, "{line}").and_then(|()| stdin.flush()).is_ok(),
            Err(_) => false,
        }
    }

    /// Close its stdin: the agent stops its engine and exits.
    pub fn hang_up(&mut self) {
        self.stdin.take();
    }

    /// Wait until `deadline` for the agent to exit, then kill the local client process.
    pub fn reap(&mut self, deadline: Instant) {
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
