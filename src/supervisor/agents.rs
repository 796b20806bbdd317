//! The head's side of the conversation with its node agents, in one place: the one path that
//! starts an agent (`up`'s supervisor and `spark-kit preflight` both use [`Agents::spawn`]), the
//! one channel everything the supervisor hears arrives on ([`Note`]: agents' events, and the
//! weights' rsync running beside the loop), and [`Agents::hear`], the one place that receives.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use crate::cluster::client::{self, AgentError, AgentProc, Msg};
use crate::cluster::protocol::Command;
use crate::cluster::push;
use crate::engine::argv::node_ranks;
use crate::kit::schema::Kit;
use crate::weights::rsync::SyncError;

/// What the supervisor hears.
pub enum Note {
    /// An agent's event, or its connection closing.
    Agent(Msg),
    /// A line of the weights' rsync to node `i`.
    SyncLine(usize, String),
    /// The weights' rsync to node `i` ended.
    Synced(usize, Result<(), SyncError>),
}

impl From<Msg> for Note {
    fn from(m: Msg) -> Self {
        Self::Agent(m)
    }
}

/// Why the agents could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot read the spark-kit executable {path} to push it to the nodes")]
    Exe { path: String, source: std::io::Error },
    #[error(transparent)]
    Agent(#[from] AgentError),
}

/// The agents of one kit's nodes and the channel they report on.
pub struct Agents {
    exe: PathBuf,
    sha: String,
    logs: PathBuf,
    kit: String,
    procs: Vec<Option<AgentProc>>,
    tx: Sender<Note>,
    rx: Receiver<Note>,
}

impl Agents {
    /// No agent started yet; `exe` is the spark-kit binary each node runs (pushed where it
    /// differs), `logs` where each agent's stderr goes.
    pub fn new(kit: &Kit, exe: &Path, logs: &Path) -> Result<Self, SpawnError> {
        let sha =
            push::sha256_file(exe).map_err(|source| SpawnError::Exe { path: exe.display().to_string(), source })?;
        let (tx, rx) = mpsc::channel();
        Ok(Self {
            exe: exe.to_path_buf(),
            sha,
            logs: logs.to_path_buf(),
            kit: kit.name.clone(),
            procs: (0..kit.nodes.len()).map(|_| None).collect(),
            tx,
            rx,
        })
    }

    /// The binary each node runs and its sha256.
    #[must_use]
    pub fn exe(&self) -> (&Path, &str) {
        (&self.exe, &self.sha)
    }

    /// Where node `i`'s agent writes its stderr.
    #[must_use]
    pub fn log(&self, kit: &Kit, i: usize) -> PathBuf {
        self.logs.join(format!("{}-{}-agent.log", self.kit, kit.nodes[i].name))
    }

    /// Start node `i`'s agent over its transport (the one spawn path).
    pub fn spawn(&mut self, kit: &Kit, i: usize) -> Result<(), SpawnError> {
        let rank = node_ranks(kit)[i];
        let log = self.log(kit, i);
        let agent = client::spawn(&kit.nodes[i], i, rank, &self.exe, &self.sha, &log, self.tx.clone())?;
        self.procs[i] = Some(agent);
        Ok(())
    }

    /// Whether node `i` has an agent connection.
    #[must_use]
    pub fn connected(&self, i: usize) -> bool {
        self.procs.get(i).is_some_and(Option::is_some)
    }

    /// Send one command to node `i`'s agent; false when it has none or its stdin is closed.
    pub fn send(&mut self, i: usize, cmd: &Command) -> bool {
        self.procs.get_mut(i).and_then(Option::as_mut).is_some_and(|a| a.send(cmd))
    }

    /// Node `i`'s agent is gone: forget it (its process reaped when it has exited).
    pub fn lost(&mut self, i: usize) {
        if let Some(mut a) = self.procs.get_mut(i).and_then(Option::take) {
            let _ = a.child.try_wait();
        }
    }

    /// Give up on node `i`'s agent (it did not answer): hang up and kill the local end now (the
    /// agent itself, or the ssh / exec client that carries it). Its connection's loss is still
    /// heard ([`Msg::Lost`]).
    pub fn kill(&mut self, i: usize) {
        if let Some(a) = self.procs.get_mut(i).and_then(Option::as_mut) {
            a.hang_up();
            a.reap(Instant::now());
        }
    }

    /// A sender onto the channel the supervisor hears (for work running beside the loop).
    #[must_use]
    pub fn sender(&self) -> Sender<Note> {
        self.tx.clone()
    }

    /// The next thing heard within `wait`, if any: the one place the head receives.
    pub fn hear(&self, wait: Duration) -> Option<Note> {
        self.rx.recv_timeout(wait).ok()
    }

    /// Hang up on every agent (each stops its engine and exits), wait up to `grace` for them,
    /// then kill the local end (the agent itself, or the ssh / exec client that carries it).
    pub fn close(&mut self, grace: Duration) {
        for a in self.procs.iter_mut().flatten() {
            a.hang_up();
        }
        let deadline = Instant::now() + grace;
        for a in self.procs.iter_mut().flatten() {
            a.reap(deadline);
        }
        self.procs.iter_mut().for_each(|p| *p = None);
    }
}
