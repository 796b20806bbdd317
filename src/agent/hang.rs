//! Hang detection on the node: which engine log lines count as progress. The agent reports
//! how long its engine has been quiet in every heartbeat; the supervisor decides when quiet
//! means hung (`hang_timeout_s`). vLLM's periodic shared-memory broadcast complaint does not
//! count as progress. Pure.

/// Lines that vLLM prints periodically while a rank is stuck; they are not progress.
const NOT_PROGRESS: &[&str] = &["No available shared memory broadcast block"];

/// Does this engine log line show progress?
#[must_use]
pub fn counts_as_progress(line: &str) -> bool {
    !line.trim().is_empty() && !NOT_PROGRESS.iter().any(|p| line.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_broadcast_lines_are_not_progress() {
        assert!(counts_as_progress("(EngineCore pid=1) INFO loading weights"));
        assert!(!counts_as_progress(
            "(EngineCore pid=1) WARNING [shm_broadcast.py:466] No available shared memory broadcast block found in 60 seconds."
        ));
        assert!(!counts_as_progress("   "));
    }
}
