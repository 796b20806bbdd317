//! Hang detection: an engine that writes no log line for `hang_timeout_s` is hung. vLLM's
//! periodic shared-memory broadcast complaint does not count as progress. Pure.

/// Lines that vLLM prints periodically while a rank is stuck; they are not progress.
const NOT_PROGRESS: &[&str] = &["No available shared memory broadcast block"];

/// Does this engine log line show progress?
#[must_use]
pub fn counts_as_progress(line: &str) -> bool {
    !line.trim().is_empty() && !NOT_PROGRESS.iter().any(|p| line.contains(p))
}

/// Is an engine quiet for `quiet_s` seconds hung under a `limit_s` threshold?
#[must_use]
pub fn is_hung(quiet_s: f64, limit_s: u32) -> bool {
    quiet_s >= f64::from(limit_s)
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
        assert!(is_hung(420.0, 420) && !is_hung(419.9, 420));
    }
}
