//! Ctrl-C and SIGTERM: the one place spark-kit installs signal handlers. The handler only
//! records the signal in atomics (async-signal-safe); `up` forwards it to the supervisor's stop
//! flag, `guard` polls [`STOP`]. [`received`] tells which signal it was (exit 128 + signal).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

/// Set once SIGINT or SIGTERM arrived.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// The signal that asked to stop; 0 = none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: nix::libc::c_int) {
    RECEIVED.store(sig, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
}

/// A handler could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot install a {signal} handler")]
pub struct SignalError {
    pub signal: Signal,
    #[source]
    pub errno: nix::Error,
}

/// How interrupted system calls behave once the handler ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syscalls {
    /// Restarted (`SA_RESTART`): the flag is polled.
    Restart,
    /// Interrupted (`EINTR`): a blocking wait wakes up at once.
    Interrupt,
}

/// Route SIGINT and SIGTERM to [`STOP`] (and [`received`]).
pub fn install(syscalls: Syscalls) -> Result<(), SignalError> {
    let flags = match syscalls {
        Syscalls::Restart => SaFlags::SA_RESTART,
        Syscalls::Interrupt => SaFlags::empty(),
    };
    let action = SigAction::new(SigHandler::Handler(on_signal), flags, SigSet::empty());
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to atomics, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }.map_err(|errno| SignalError { signal, errno })?;
    }
    Ok(())
}

/// [`install`] (restarting system calls), and a thread that sets `stop` once a signal arrived.
pub fn forward_to(stop: Arc<AtomicBool>) -> Result<(), SignalError> {
    install(Syscalls::Restart)?;
    std::thread::spawn(move || loop {
        if STOP.load(Ordering::SeqCst) {
            stop.store(true, Ordering::SeqCst);
        }
        std::thread::sleep(Duration::from_millis(100));
    });
    Ok(())
}

/// The signal number that asked to stop, if any.
#[must_use]
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// `SIGINT`, `SIGTERM` (the number when it is not a known signal).
#[must_use]
pub fn name(sig: i32) -> String {
    Signal::try_from(sig).map_or_else(|_| sig.to_string(), |s| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(name(2), "SIGINT");
        assert_eq!(name(15), "SIGTERM");
        assert_eq!(name(999), "999");
    }
}
