//! The guard's acting side: send the signal (a process, the engine's process group, or a
//! container through `docker kill --signal`), follow it to the end, escalate (a container's
//! processes also by pid), and write the receipt. Everything after the first signal is off the
//! hot path.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use super::attribution::{Attribution, BUCKETS};
use super::config::GuardConfig;
use super::engine::{CgroupWatch, ContainerId, EngineRef};
use super::events::GuardEvent;
use super::meminfo::Meminfo;
use super::pagecache;
use super::policy::{Decision, EngineReason};
use super::receipt::{self, Outcome, Receipt, SignalSent};
use super::sampler::{ms, Guard};
use crate::kit::schema::GuardPolicy;

/// What an action is aimed at.
#[derive(Debug, Clone, Copy)]
pub(super) enum Target {
    Group(i32),
    Container { id: ContainerId, pid: i32 },
    Process { pid: i32, starttime: u64 },
}

/// An action in progress.
pub(super) struct Action {
    pub(super) decision: Decision,
    pub(super) target: Target,
    pub(super) started: Instant,
    pub(super) escalated: bool,
    pub(super) grace: Duration,
    pub(super) receipt: Receipt,
    pub(super) crossing: Instant,
    /// `docker kill` commands sent for this action, reaped when it ends.
    pub(super) pending: Vec<(&'static str, Child)>,
}

impl Guard {
    /// Send the first signal. The only work before `kill` is reading the start time.
    pub(super) fn act(
        &mut self,
        d: Decision,
        crossed: (Instant, Meminfo),
        m: &Meminfo,
        a: &Attribution,
        drop: u64,
        bucket_len: Duration,
    ) -> Option<Action> {
        let mut pending = Vec::new();
        let (target, result) = match d {
            Decision::StopEngine { pgid, .. } => match self.current {
                Some(EngineRef::Container { id, pid }) => {
                    let t = Target::Container { id, pid };
                    (t, docker_kill(id, "SIGTERM").map(|c| pending.push(("SIGTERM", c))))
                }
                _ => (Target::Group(pgid), killpg(Pid::from_raw(pgid), Signal::SIGTERM).map_err(SignalError::Kill)),
            },
            Decision::KillProcess { grower, .. } => {
                let starttime = self.table.starttime(grower.pid).unwrap_or(0);
                let sent = kill(Pid::from_raw(grower.pid), Signal::SIGTERM).map_err(SignalError::Kill);
                (Target::Process { pid: grower.pid, starttime }, sent)
            }
            _ => return None,
        };
        let sent = Instant::now();
        // Off the hot path from here: the signal is out.
        self.status.actions.fetch_add(1, Ordering::Relaxed);
        let reaction = ms(sent.duration_since(crossed.0));
        let mut r = self.receipt(d, &crossed.1, m, a, drop, bucket_len);
        r.reaction_ms = Some(reaction);
        r.signals.push(signal_record(target, "SIGTERM", reaction, result.err().map(|e| e.to_string())));
        let grace = match target {
            Target::Group(_) | Target::Container { .. } => self.cfg.drain,
            Target::Process { .. } => self.cfg.kill_grace,
        };
        self.emit(&GuardEvent::Acting {
            decision: d.name(),
            reason: r.reason.clone(),
            victim: r.victim,
            engine: r.engine,
            signal: "SIGTERM",
            reaction_ms: reaction,
        });
        Some(Action {
            decision: d,
            target,
            started: sent,
            escalated: false,
            grace,
            receipt: r,
            crossing: crossed.0,
            pending,
        })
    }

    /// Follow an action; true when it is over (victim gone, or the guard gave up).
    pub(super) fn progress(&mut self, act: &mut Action, m: &Meminfo, now: Instant) -> bool {
        let gone = match act.target {
            Target::Group(pgid) => self.table.group_size(pgid) == 0,
            Target::Container { .. } => self.cgroup.as_ref().is_none_or(|w| w.members.is_empty()),
            Target::Process { pid, starttime } => !self.table.alive(pid, starttime),
        };
        if gone {
            return true;
        }
        let emergency = m.mem_available <= self.cfg.hard_floor / 2;
        if !act.escalated && (now.duration_since(act.started) >= act.grace || emergency) {
            act.escalated = true;
            let result = match act.target {
                Target::Group(pgid) => killpg(Pid::from_raw(pgid), Signal::SIGKILL).map_err(SignalError::Kill),
                Target::Container { id, .. } => docker_kill(id, "SIGKILL").map(|c| act.pending.push(("SIGKILL", c))),
                Target::Process { pid, .. } => kill(Pid::from_raw(pid), Signal::SIGKILL).map_err(SignalError::Kill),
            };
            let after = ms(Instant::now().duration_since(act.crossing));
            act.receipt.signals.push(signal_record(act.target, "SIGKILL", after, result.err().map(|e| e.to_string())));
            // A container's processes are also killed by pid, from the host: `docker kill` needs a
            // daemon that answers, and under memory pressure it may not (a stuck daemon left the
            // container running). Needs the right to signal them (root, or the same user).
            if let Target::Container { id, pid } = act.target {
                let refused = self.cgroup.as_mut().and_then(CgroupWatch::kill_all);
                let after = ms(Instant::now().duration_since(act.crossing));
                act.receipt.signals.push(SignalSent {
                    signal: "SIGKILL",
                    target: "container-pids",
                    id: pid,
                    container: Some(id),
                    after_crossing_ms: after,
                    error: refused,
                });
            }
        }
        now.duration_since(act.started) >= act.grace + Duration::from_secs(10)
    }

    pub(super) fn finish(&mut self, act: Action, m: &Meminfo) {
        let mut r = act.receipt;
        // `docker kill` answers after the signal went out; its failures join the receipt.
        for (signal, child) in act.pending {
            if let Some(e) = docker_result(child) {
                if let Some(s) = r.signals.iter_mut().find(|s| s.signal == signal && s.error.is_none()) {
                    s.error = Some(e);
                }
            }
        }
        let mut survivors = Vec::new();
        match act.target {
            Target::Group(pgid) => self.table.for_each_member(pgid, |p| survivors.push(p)),
            Target::Container { .. } => {
                if let Some(w) = self.cgroup.as_ref() {
                    survivors.extend_from_slice(&w.members);
                }
            }
            Target::Process { pid, starttime } => {
                if self.table.alive(pid, starttime) {
                    survivors.push(pid);
                }
            }
        }
        let gone = survivors.is_empty();
        let took = ms(Instant::now().duration_since(act.started));
        r.outcome = Some(Outcome { gone, ms: took, survivors, mem_available_after: m.mem_available });
        let (path, error) = match receipt::write(&self.receipts, &r) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(format!("cannot write the receipt in {}: {e}", self.receipts.display()))),
        };
        self.emit(&GuardEvent::Acted { decision: act.decision.name(), gone, ms: took, receipt: path, error });
    }

    pub(super) fn soft(&mut self, m: &Meminfo, a: &Attribution, drop: u64, bucket_len: Duration) {
        let dropped = pagecache::drop_cache(&self.model_files);
        let mut r = self.receipt(Decision::Soft, m, m, a, drop, bucket_len);
        r.cache_dropped.clone_from(&dropped);
        let path = receipt::write(&self.receipts, &r).ok();
        self.emit(&GuardEvent::SoftFloor {
            mem_available: m.mem_available,
            growers: a.growers().to_vec(),
            cache_dropped: dropped.len(),
            receipt: path,
        });
    }

    pub(super) fn receipt(
        &mut self,
        d: Decision,
        crossed: &Meminfo,
        m: &Meminfo,
        a: &Attribution,
        drop: u64,
        bucket_len: Duration,
    ) -> Receipt {
        let (unix_ms, time) = receipt::now();
        let victim = match d {
            Decision::KillProcess { grower, .. } => Some(grower),
            _ => None,
        };
        Receipt {
            time,
            unix_ms,
            node: self.cfg.node.clone(),
            decision: d.name(),
            reason: reason(&d, a, m, &self.cfg),
            policy: policy_name(self.cfg.policy),
            soft_floor: self.cfg.soft_floor,
            hard_floor: self.cfg.hard_floor,
            at_crossing: *crossed,
            at_decision: *m,
            pressure: self.read_pressure(),
            window_s: (bucket_len * u32::try_from(BUCKETS).unwrap_or(8)).as_secs_f64(),
            window_drop: drop,
            unattributed: drop.saturating_sub(a.attributed_bytes),
            gpu_memory_source: self.gpu_source(),
            engine: a.engine,
            growers: a.growers().to_vec(),
            victim,
            signals: Vec::with_capacity(2),
            reaction_ms: None,
            outcome: None,
            cache_dropped: Vec::new(),
        }
    }
}

fn signal_record(target: Target, signal: &'static str, after: f64, err: Option<String>) -> SignalSent {
    let (kind, id, container) = match target {
        Target::Group(p) => ("pgid", p, None),
        Target::Container { id, pid } => ("container", pid, Some(id)),
        Target::Process { pid, .. } => ("pid", pid, None),
    };
    SignalSent { signal, target: kind, id, container, after_crossing_ms: after, error: err }
}

/// `docker kill --signal SIG <id>`, started, not waited for (the signal is what counts; the
/// child is reaped when the action ends).
fn docker_kill(id: ContainerId, signal: &str) -> Result<Child, SignalError> {
    Command::new("docker")
        .args(["kill", "--signal", signal, id.as_str()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(SignalError::DockerKill)
}

/// Why a signal could not be sent (its text goes into the receipt).
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    #[error("{0}")]
    Kill(#[source] nix::errno::Errno),
    #[error("cannot run docker kill: {0}")]
    DockerKill(#[source] std::io::Error),
}

/// The error of a `docker kill`, if it failed or has not answered by the end of the action (then
/// the client is stopped: a daemon that does not answer must not hold the guard).
fn docker_result(mut child: Child) -> Option<String> {
    match child.try_wait() {
        Ok(Some(_)) => {}
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            return Some("docker kill: the Docker daemon had not answered by the end of the action".into());
        }
        Err(e) => return Some(format!("docker kill: {e}")),
    }
    match child.wait_with_output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("docker kill: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Some(format!("docker kill: {e}")),
    }
}

/// `protect-host`, `kill-offender`, `off`.
#[must_use]
pub const fn policy_name(p: GuardPolicy) -> &'static str {
    match p {
        GuardPolicy::ProtectHost => "protect-host",
        GuardPolicy::KillOffender => "kill-offender",
        GuardPolicy::Off => "off",
    }
}

#[allow(clippy::cast_precision_loss)]
fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

fn reason(d: &Decision, a: &Attribution, m: &Meminfo, cfg: &GuardConfig) -> String {
    let top = a.growers().first().map_or_else(
        || "no process grew".to_string(),
        |g| format!("top grower {} (pid {}) +{}", g.comm.as_str(), g.pid, gib(g.grown)),
    );
    let engine = a.engine.map_or_else(|| "no engine".to_string(), |e| format!("engine group +{}", gib(e.grown_bytes)));
    let at = format!("MemAvailable {} ≤ {}", gib(m.mem_available), gib(cfg.hard_floor));
    match d {
        Decision::Idle => "above the floors".into(),
        Decision::Soft => {
            format!("MemAvailable {} ≤ soft floor {}; {top}; {engine}", gib(m.mem_available), gib(cfg.soft_floor))
        }
        Decision::StopEngine { reason: EngineReason::EngineGrew, .. } => {
            format!("{at}: the engine grew ({engine}; {top})")
        }
        Decision::StopEngine { reason: EngineReason::ProtectHost, .. } => {
            format!("{at}: {top}, but policy protect-host and it is not sacrificable: stopping the engine ({engine})")
        }
        Decision::StopEngine { reason: EngineReason::Unattributed, .. } => {
            format!("{at}: no process clearly grew ({top}; {engine}): stopping the engine to protect the host")
        }
        Decision::KillProcess { sacrificable: true, .. } => format!("{at}: {top}, sacrificable per the kit; {engine}"),
        Decision::KillProcess { .. } => format!("{at}: {top}, policy kill-offender; {engine}"),
        Decision::Off => format!("{at}: policy off, no action"),
        Decision::NoVictim => format!("{at}: no engine running and no eligible grower ({top})"),
    }
}
