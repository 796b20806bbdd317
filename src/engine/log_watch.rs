//! What the node agent reads from its engine's log lines, besides hang detection: the boot phase
//! ([`super::boot_phase`]) and the children that died ([`super::child_exit`]). Pure.

use super::boot_phase::{Phase, Tracker};
use super::child_exit::{self, ChildExit};

/// One engine run's view of its log.
#[derive(Debug, Default)]
pub struct LogWatch {
    tracker: Tracker,
    children: Vec<ChildExit>,
    sent: Option<Phase>,
}

impl LogWatch {
    /// Feed one line (progress bars may carry several `\r`-separated updates).
    pub fn observe(&mut self, line: &str) {
        for part in line.split('\r').filter(|p| !p.trim().is_empty()) {
            match ChildExit::parse(part) {
                Some(c) => self.children.push(c),
                None => {
                    self.tracker.observe(part);
                }
            }
        }
    }

    /// The phase, described, when it changed since the last call.
    pub fn phase_update(&mut self) -> Option<String> {
        let now = self.tracker.current()?;
        if self.sent.as_ref() == Some(now) {
            return None;
        }
        self.sent = Some(now.clone());
        Some(now.describe())
    }

    /// The engine's exit status with what died first (see [`child_exit::describe`]).
    #[must_use]
    pub fn exit_status(&self, status: &str) -> String {
        child_exit::describe(status, &self.children)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::child_exit::Ending;

    #[test]
    fn phases_are_reported_once_each_and_the_crash_is_named() {
        let mut w = LogWatch::default();
        assert_eq!(w.phase_update(), None);
        w.observe("x local/r0 err| \rLoading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]\rLoading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01]");
        assert_eq!(w.phase_update().as_deref(), Some("loading weights: shard 1/2"));
        assert_eq!(w.phase_update(), None);
        let died = ChildExit { pid: 7, comm: "VLLM::EngineCor".into(), ending: Ending::Signal(9) };
        w.observe(&format!("2026-12-03T10:25:45.158Z local/r0 err| {}", died.line()));
        assert_eq!(w.phase_update(), None);
        assert_eq!(
            w.exit_status("exit status: 0"),
            "exit status: 0; first to die: its child pid 7 (VLLM::EngineCor) killed by signal 9 (SIGKILL)"
        );
    }
}
