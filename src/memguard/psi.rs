//! Pressure stall information (`/proc/pressure/memory`): a pure parser for the readings in
//! receipts, and a trigger fd that `poll()` wakes on when tasks stall on memory, so a sudden
//! collapse wakes the guard at once instead of at its next sample (kernel `psi.rst`).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::Serialize;

/// One `/proc/pressure/memory` reading: share of time (percent, 10 s average) some / all
/// non-idle tasks stalled on memory, and the cumulative stall in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Pressure {
    pub some_avg10: f32,
    pub full_avg10: f32,
    pub some_total_us: u64,
    pub full_total_us: u64,
}

/// Parse PSI text (`some avg10=0.00 avg60=… total=N` and the `full` line). Pure, no allocation.
#[must_use]
pub fn parse(text: &[u8]) -> Option<Pressure> {
    let mut p = Pressure::default();
    let (mut some, mut full) = (false, false);
    for line in text.split(|&b| b == b'\n') {
        let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
        let kind = words.next();
        let (avg10, total) = match kind {
            Some(b"some") => (&mut p.some_avg10, &mut p.some_total_us),
            Some(b"full") => (&mut p.full_avg10, &mut p.full_total_us),
            _ => continue,
        };
        let (mut got_avg, mut got_total) = (false, false);
        for w in words {
            if let Some(v) = w.strip_prefix(b"avg10=") {
                *avg10 = std::str::from_utf8(v).ok()?.parse().ok()?;
                got_avg = true;
            } else if let Some(v) = w.strip_prefix(b"total=") {
                *total = std::str::from_utf8(v).ok()?.parse().ok()?;
                got_total = true;
            }
        }
        if !(got_avg && got_total) {
            return None;
        }
        match kind {
            Some(b"some") => some = true,
            _ => full = true,
        }
    }
    (some && full).then_some(p)
}

/// A registered PSI trigger: `poll()` on it returns when memory stall crosses the threshold
/// within the window.
pub struct Trigger {
    file: File,
    /// The trigger as written, e.g. `some 100000 1000000`.
    pub spec: String,
}

/// What happened while waiting on the trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The stall threshold was crossed.
    Pressure,
    /// The timeout passed.
    Timeout,
    /// A signal interrupted the wait.
    Interrupted,
}

impl Trigger {
    /// Register a trigger on `path` (normally `/proc/pressure/memory`): a stall of `stall` within
    /// each `window`. Unprivileged processes may only use windows that are multiples of 2 s, so
    /// a 1 s window that is refused is retried as 2 s with a doubled stall.
    pub fn open(path: &Path, stall: Duration, window: Duration) -> std::io::Result<Self> {
        match Self::register(path, stall, window) {
            Ok(t) => Ok(t),
            Err(first) if window < Duration::from_secs(2) => {
                Self::register(path, stall * 2, Duration::from_secs(2)).map_err(|_| first)
            }
            Err(e) => Err(e),
        }
    }

    fn register(path: &Path, stall: Duration, window: Duration) -> std::io::Result<Self> {
        let mut file = OpenOptions::new().read(true).write(true).custom_flags(nix::libc::O_NONBLOCK).open(path)?;
        let spec = format!("some {} {}", stall.as_micros(), window.as_micros());
        let mut bytes = spec.clone().into_bytes();
        bytes.push(0);
        file.write_all(&bytes)?;
        Ok(Self { file, spec })
    }

    /// Wait up to `timeout` for the trigger. Allocation-free.
    pub fn wait(&self, timeout: Duration) -> std::io::Result<Wake> {
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.file.as_fd(), PollFlags::POLLPRI)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => Ok(Wake::Timeout),
            Ok(_) => {
                let revents = fds[0].revents().unwrap_or(PollFlags::empty());
                if revents.contains(PollFlags::POLLERR) {
                    Err(std::io::Error::other("the PSI trigger was removed (POLLERR)"))
                } else {
                    Ok(Wake::Pressure)
                }
            }
            Err(nix::errno::Errno::EINTR) => Ok(Wake::Interrupted),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_recorded_pressure() {
        let text = include_bytes!("../../tests/fixtures/node/gb10-healthy/proc/pressure/memory");
        let p = parse(text).unwrap();
        assert!((p.some_avg10 - 0.0).abs() < f32::EPSILON);
        assert_eq!(p.some_total_us, 19_660_161);
        assert_eq!(p.full_total_us, 10_472_220);
        let collapse =
            parse(b"some avg10=41.20 avg60=9.10 avg300=2.00 total=88\nfull avg10=30.5 avg60=1 avg300=0 total=77\n")
                .unwrap();
        assert!((collapse.full_avg10 - 30.5).abs() < 1e-4);
    }

    #[test]
    fn refuses_partial_text() {
        assert_eq!(parse(b"some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n"), None);
        assert_eq!(parse(b"some avg10=x total=1\nfull avg10=0 total=1\n"), None);
        assert_eq!(parse(b""), None);
    }
}
