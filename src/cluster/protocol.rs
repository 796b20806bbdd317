//! The node agent's protocol: JSON lines, one message per line, versioned.
//! Supervisor → agent on the agent's stdin ([`Command`]); agent → supervisor on its stdout
//! ([`Event`]). Pure types and (de)serialisation; unit-tested.

use serde::{Deserialize, Serialize};

use crate::kit::Kit;
use crate::node::facts::{FactRequest, NodeFacts};

/// Protocol version; both sides refuse other versions.
pub const VERSION: u32 = 1;

/// What the supervisor asks of an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// Prepare and start this node's engine for the given kit.
    Start {
        kit: Box<Kit>,
        /// Index of this node in `kit.nodes`.
        node: usize,
    },
    /// Drain for `drain_s` seconds, then kill the engine's process group.
    Stop { drain_s: u64 },
    /// Report presence and size of files (weights check): paths relative to `root`.
    CheckFiles { root: String, files: Vec<String> },
    /// Gather this node's preflight facts (answered with [`Event::Facts`]).
    Preflight { request: FactRequest },
    /// Remove what an earlier run of `kit` left on this node (`up --replace`; docker: its
    /// containers, by label). Answered with [`Event::Cleaned`].
    Clean { kit: Box<Kit> },
}

/// What an agent reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// First line: who and what is running.
    Hello { version: String, protocol: u32, node: String, pid: u32 },
    /// A preparation phase (setup, model, engine) began.
    Phase { name: String, detail: String },
    /// The engine process is running with this process group.
    Started { pgid: i32, log: String },
    /// The head's API answered `/health` 200 (head only).
    Ready { seconds: f64 },
    /// Periodic state (every second).
    Heartbeat {
        engine_alive: bool,
        /// Seconds since the last engine log line that counts for hang detection.
        quiet_s: f64,
        mem_available: Option<u64>,
        /// Head only: the last `/health` probe answered 200.
        healthy: Option<bool>,
        /// Head only, from `/metrics`: (requests running, generated tokens so far).
        #[serde(default)]
        progress: Option<(f64, f64)>,
    },
    /// The booting engine's phase changed (from its log: `loading weights: shard 3/39`).
    Boot { phase: String },
    /// The engine exited on its own.
    Exited { status: String, log_tail: String },
    /// The engine group was stopped; survivors must be empty.
    Stopped { graceful: bool, seconds: f64, survivors: Vec<String> },
    /// What [`Command::Clean`] removed (names).
    Cleaned { removed: Vec<String> },
    /// What the engine runs in, once the runtime knows (docker: the container and image ids).
    EngineIds { container_id: String, image_id: String },
    /// Answer to `CheckFiles`: (path, size) for present files, and the missing ones.
    Files { present: Vec<(String, u64)>, missing: Vec<String> },
    /// Answer to `Preflight`: the node's raw facts; the verdicts are computed by the asker.
    Facts { facts: Box<NodeFacts> },
    /// The node's memory guard reported something (its event, as JSON).
    Guard { event: serde_json::Value },
    /// Something failed; the agent keeps running unless `fatal`.
    Error { message: String, fatal: bool },
}

/// One message as a JSON line (no trailing newline).
pub fn encode<T: Serialize>(msg: &T) -> Result<String, serde_json::Error> {
    let mut v = serde_json::to_value(msg)?;
    if let serde_json::Value::Object(m) = &mut v {
        m.insert("v".into(), VERSION.into());
    }
    serde_json::to_string(&v)
}

/// Why a line was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("protocol version {got} from the other side, expected {VERSION}; run the same spark-kit on every node")]
    Version { got: u64 },
    #[error("malformed protocol line ({0})")]
    Malformed(String),
}

/// Parse one line.
pub fn decode<T: for<'de> Deserialize<'de>>(line: &str) -> Result<T, DecodeError> {
    let mut v: serde_json::Value = serde_json::from_str(line).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    let got = v.get("v").and_then(serde_json::Value::as_u64).unwrap_or(0);
    if got != u64::from(VERSION) {
        return Err(DecodeError::Version { got });
    }
    if let serde_json::Value::Object(m) = &mut v {
        m.remove("v");
    }
    serde_json::from_value(v).map_err(|e| DecodeError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_version() {
        let e = Event::Heartbeat {
            engine_alive: true,
            quiet_s: 1.5,
            mem_available: Some(7),
            healthy: None,
            progress: None,
        };
        let line = encode(&e).unwrap();
        assert!(line.contains(r#""ev":"heartbeat""#) && line.contains(r#""v":1"#), "{line}");
        assert_eq!(decode::<Event>(&line).unwrap(), e);
        assert_eq!(decode::<Event>(r#"{"v":2,"ev":"hello"}"#), Err(DecodeError::Version { got: 2 }));
        assert!(matches!(decode::<Event>(r#"{"v":1,"ev":"nope"}"#), Err(DecodeError::Malformed(_))));
        let c = Command::Stop { drain_s: 5 };
        assert_eq!(decode::<Command>(&encode(&c).unwrap()).unwrap(), c);
    }
}
