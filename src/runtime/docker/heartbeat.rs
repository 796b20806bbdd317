//! Long docker calls (`import`, `save`, `load`: minutes for a large image) watched by the daemon's
//! heartbeat instead of a time limit: the daemon is asked whether it answers once before the call
//! and then every [`Heartbeat::every`] while it runs; when [`Heartbeat::misses`] checks in a row
//! get no answer the call is stopped (its process group killed) and fails naming the daemon. A
//! slow daemon that still answers is waited for as long as it works; a wedged one (accepting
//! connections, answering none) no longer hangs `image build` or `image sync` forever. Every
//! [`crate::engine::STILL_EVERY`] the caller hears that the call is still running (no quiet minute).

use std::process::Command;
use std::time::{Duration, Instant};

use super::dockerctl::DockerError;
use crate::bounded::{self, Ended};

/// How often the daemon is asked during a long call, and how many unanswered checks in a row end it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    pub every: Duration,
    pub misses: u32,
}

/// spark-kit's long calls: a check every 30 s, given up after 3 misses in a row (each check may
/// itself take [`super::dockerctl::QUERY_LIMIT`]): a wedged daemon is named within ~2 minutes.
pub const LONG_CALLS: Heartbeat = Heartbeat { every: Duration::from_secs(30), misses: 3 };

/// The watch's state over time (pure: the caller supplies the clock and the checks' answers).
#[derive(Debug, Clone)]
pub struct Watch {
    beat: Heartbeat,
    next: Instant,
    missed: u32,
    start: Instant,
    still_every: Duration,
    next_still: Instant,
}

impl Watch {
    /// A watch whose first check is due `beat.every` after `now`, and its first "still running"
    /// `still_every` after it.
    #[must_use]
    pub fn new(beat: Heartbeat, still_every: Duration, now: Instant) -> Self {
        Self { beat, next: now + beat.every, missed: 0, start: now, still_every, next_still: now + still_every }
    }

    /// The time since the start when a "still running" is due at `now` (then the next one is due
    /// `still_every` later; none missed are made up).
    pub fn still_due(&mut self, now: Instant) -> Option<Duration> {
        if now < self.next_still || self.still_every.is_zero() {
            return None;
        }
        while self.next_still <= now {
            self.next_still += self.still_every;
        }
        Some(now - self.start)
    }

    /// Whether a check is due at `now`.
    #[must_use]
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// A check finished at `now`, answered or not; true when the call must be given up. The next
    /// check is due `every` after this one finished.
    pub fn answered(&mut self, ok: bool, now: Instant) -> bool {
        self.missed = if ok { 0 } else { self.missed + 1 };
        self.next = now + self.beat.every;
        self.missed >= self.beat.misses.max(1)
    }
}

/// Run the docker call `cmd` (named `what` in errors, `image` for a missing image) to its end
/// while `alive` keeps answering: `alive` once first (its error is the call's, and the call never
/// starts), then per `beat`; `still` hears the time since the start every
/// [`crate::engine::STILL_EVERY`]. Its stdout, trimmed, or the classified error.
pub fn watched(
    cmd: &mut Command,
    what: &str,
    image: Option<&str>,
    beat: Heartbeat,
    alive: &mut dyn FnMut() -> Result<(), DockerError>,
    still: &mut dyn FnMut(Duration),
) -> Result<String, DockerError> {
    alive()?;
    let mut watch = Watch::new(beat, crate::engine::STILL_EVERY, Instant::now());
    let mut given_up = false;
    let ended = bounded::run_until(cmd, &mut || {
        if let Some(t) = watch.still_due(Instant::now()) {
            still(t);
        }
        if !given_up && watch.due(Instant::now()) {
            let ok = alive().is_ok();
            given_up = watch.answered(ok, Instant::now());
        }
        given_up
    })
    .map_err(|e| super::dockerctl::spawn_error(what, &e))?;
    match ended {
        Ended::Exited { status, stdout, stderr } => super::dockerctl::answer(what, image, status, &stdout, &stderr),
        Ended::Late { .. } | Ended::HeldOpen => Err(DockerError::Unresponsive {
            what: what.to_string(),
            checks: beat.misses,
            every_s: beat.every.as_secs(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_given_up_only_after_the_misses_in_a_row() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = Watch::new(Heartbeat { every: s(30), misses: 3 }, s(10), t0);
        assert!(!w.due(t0 + s(29)) && w.due(t0 + s(30)));
        assert!(!w.answered(false, t0 + s(40)));
        // The next check counts from when this one finished (a check may take its 10 s).
        assert!(!w.due(t0 + s(69)) && w.due(t0 + s(70)));
        assert!(!w.answered(false, t0 + s(80)));
        // An answer in between starts the count again.
        assert!(!w.answered(true, t0 + s(110)));
        assert!(!w.answered(false, t0 + s(140)));
        assert!(!w.answered(false, t0 + s(170)));
        assert!(w.answered(false, t0 + s(200)));
        // misses 0 is taken as 1: the first unanswered check ends it.
        let mut w = Watch::new(Heartbeat { every: s(1), misses: 0 }, s(10), t0);
        assert!(w.answered(false, t0 + s(1)));
    }

    #[test]
    fn still_running_is_said_every_period_and_a_late_look_makes_up_none() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = Watch::new(Heartbeat { every: s(30), misses: 3 }, s(10), t0);
        assert_eq!(w.still_due(t0 + s(9)), None);
        assert_eq!(w.still_due(t0 + s(10)), Some(s(10)));
        assert_eq!(w.still_due(t0 + s(15)), None);
        // Looked at only after 35 s (a check took its time): one line, the next at 40 s.
        assert_eq!(w.still_due(t0 + s(35)), Some(s(35)));
        assert_eq!(w.still_due(t0 + s(39)), None);
        assert_eq!(w.still_due(t0 + s(40)), Some(s(40)));
    }

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn a_call_ends_when_the_heartbeat_stops_and_runs_on_while_it_answers() {
        let beat = Heartbeat { every: Duration::from_millis(100), misses: 2 };
        // Answers for 0.5 s, then no more: the 30 s call is stopped soon after.
        let t = Instant::now();
        let mut alive = || {
            if t.elapsed() < Duration::from_millis(500) {
                Ok(())
            } else {
                Err(DockerError::NoAnswer { what: "version".into(), secs: 10 })
            }
        };
        let e = watched(&mut sh("sleep 30"), "import", None, beat, &mut alive, &mut |_| {}).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(e, DockerError::Unresponsive { what: "import".into(), checks: 2, every_s: 0 });
        // A daemon that answers throughout: a call longer than many beats finishes, its output kept.
        let out = watched(&mut sh("sleep 1; echo done"), "import", None, beat, &mut || Ok(()), &mut |_| {}).unwrap();
        assert_eq!(out, "done");
        // Not answering before the call: the call never starts, the first check's error is returned.
        let marker = tempfile::tempdir().unwrap();
        let file = marker.path().join("ran");
        let no = DockerError::NoDaemon("Cannot connect".into());
        let e = watched(
            &mut sh(&format!("touch {}", file.display())),
            "import",
            None,
            beat,
            &mut || Err(no.clone()),
            &mut |_| {},
        )
        .unwrap_err();
        assert_eq!(e, no);
        assert!(!file.exists());
        // A failing call is classified as any other.
        let fail = "echo 'Error: No such image: x' >&2; exit 1";
        let e = watched(&mut sh(fail), "save", Some("x"), beat, &mut || Ok(()), &mut |_| {}).unwrap_err();
        assert_eq!(e, DockerError::NoImage("x".into()));
    }
}
