//! The deployment's restart state machine. Pure: inputs and the current time in, actions out;
//! the supervisor loop performs the actions. Every transition is unit-tested.

use serde::Serialize;

/// Where the deployment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Engines are being prepared and started; not serving yet.
    Starting,
    /// The head answers `/health` and every rank is alive.
    Ready,
    /// Serving was established but the head's health probe fails.
    Degraded,
    /// A rank died or hung: everything is being stopped and will start again.
    Restarting,
    /// A stop was requested.
    Stopping,
    /// Stopped on request.
    Stopped,
    /// Gave up (too many restarts, or a start that cannot succeed).
    Failed,
}

/// A bring-up gate: while `Starting`, the machine walks through the gates the run asks for, in
/// this order, each ended by [`Input::GatePassed`] or [`Input::GateFailed`]; a stop request at
/// any of them ends the run at once. After [`Gate::Engines`] the deployment is booting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    /// Start one agent per node and wait for each one's hello.
    Agents,
    /// `up --replace`: every agent removes what an earlier run left.
    Replace,
    /// Preflight on every node.
    Preflight,
    /// The weights on every node (the rsync included).
    Weights,
    /// The engines started, workers first (each reports started before the next).
    Engines,
}

impl Gate {
    /// Before [`Gate::Engines`] no engine runs: a stop or a failure only closes the agents.
    #[must_use]
    pub const fn before_engines(self) -> bool {
        !matches!(self, Gate::Engines)
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The current bring-up gate is done.
    GatePassed(Gate),
    /// The current bring-up gate (before the engines) cannot pass.
    GateFailed { gate: Gate, why: String },
    /// The head's API answered `/health` 200 for the first time since start.
    HeadReady,
    /// A periodic health probe of the head.
    Health(bool),
    /// A rank is gone: its engine exited (`node`), or its agent vanished.
    RankDead { node: String, why: String },
    /// A rank wrote no log line for the hang threshold.
    Hung { node: String, quiet_s: f64 },
    /// Starting a node failed in a way a retry may fix.
    StartFailed { node: String, why: String },
    /// The user asked to stop.
    StopRequested,
    /// Every agent reports its engine stopped.
    AllStopped,
    /// Memory is back near the idle baseline and the backoff has passed.
    RestartDue,
}

/// What the supervisor must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Begin this bring-up gate.
    RunGate(Gate),
    /// Start the engines (workers first, then the head): the [`Gate::Engines`] gate again.
    StartAll,
    /// Stop every engine (drain, then kill the groups).
    StopAll { reason: String },
    /// Take stack dumps of every rank before stopping (hangs).
    DumpStacks,
    /// Wait at least `delay_s`, and until memory is back near the baseline, then feed `RestartDue`.
    ScheduleRestart { delay_s: f64 },
    /// End the supervisor with this exit code.
    Exit(i32),
    /// The deployment serves again after a restart (say so).
    ServingAgain,
}

/// Restart policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Most restarts allowed within `window_s`.
    pub max_restarts: usize,
    pub window_s: f64,
    /// First backoff; doubles per restart in the window, capped at `backoff_max_s`.
    pub backoff_s: f64,
    pub backoff_max_s: f64,
}

impl Default for Policy {
    fn default() -> Self {
        Self { max_restarts: 3, window_s: 1800.0, backoff_s: 5.0, backoff_max_s: 120.0 }
    }
}

/// The machine.
#[derive(Debug, Clone)]
pub struct Machine {
    pub state: State,
    pub policy: Policy,
    /// Times of restarts (seconds on the caller's clock).
    pub restarts: Vec<f64>,
    /// Why the last stop or restart happened.
    pub reason: Option<String>,
    /// The deployment was Ready at least once. Failures before that are boot failures:
    /// deterministic more often than not, so they fail at once instead of restarting.
    pub ever_ready: bool,
    /// The bring-up gate in progress (while `Starting`).
    pub gate: Option<Gate>,
    /// The gates still to come, in order.
    pub upcoming: Vec<Gate>,
}

impl Machine {
    #[must_use]
    pub fn new(policy: Policy) -> Self {
        Self {
            state: State::Starting,
            policy,
            restarts: Vec::new(),
            reason: None,
            ever_ready: false,
            gate: None,
            upcoming: Vec::new(),
        }
    }

    /// Begin the bring-up through `gates` (in order); returns the first gate's action.
    pub fn begin(&mut self, gates: &[Gate]) -> Vec<Action> {
        self.upcoming = gates.iter().rev().copied().collect();
        self.next_gate()
    }

    fn next_gate(&mut self) -> Vec<Action> {
        self.gate = self.upcoming.pop();
        self.gate.map(Action::RunGate).into_iter().collect()
    }

    /// Restarts within the window ending at `now`.
    #[must_use]
    pub fn recent_restarts(&self, now: f64) -> usize {
        self.restarts.iter().filter(|t| now - **t <= self.policy.window_s).count()
    }

    fn backoff(&self, now: f64) -> f64 {
        let n = self.recent_restarts(now).saturating_sub(1);
        let exp = i32::try_from(n.min(16)).unwrap_or(16);
        (self.policy.backoff_s * 2f64.powi(exp)).min(self.policy.backoff_max_s)
    }

    fn fail_or_restart(&mut self, why: String, now: f64, dump: bool) -> Vec<Action> {
        self.reason = Some(why.clone());
        self.gate = None;
        let mut out = Vec::new();
        if dump {
            out.push(Action::DumpStacks);
        }
        if !self.ever_ready {
            self.state = State::Failed;
            out.push(Action::StopAll { reason: format!("{why}; the deployment never became ready, not restarting") });
        } else if self.recent_restarts(now) >= self.policy.max_restarts {
            self.state = State::Failed;
            out.push(Action::StopAll {
                reason: format!("{why}; giving up after {} restarts", self.policy.max_restarts),
            });
        } else {
            self.state = State::Restarting;
            self.restarts.push(now);
            out.push(Action::StopAll { reason: why });
        }
        out
    }

    /// Apply one input at time `now`; returns the actions to perform, in order.
    pub fn step(&mut self, input: Input, now: f64) -> Vec<Action> {
        use State as S;
        let early = self.gate.is_some_and(Gate::before_engines);
        match (self.state, input) {
            (S::Stopping | S::Stopped | S::Failed, Input::StopRequested) => Vec::new(),
            (S::Starting, Input::GatePassed(g)) if self.gate == Some(g) => self.next_gate(),
            (S::Starting, Input::GateFailed { gate, why }) if self.gate == Some(gate) => {
                self.state = S::Failed;
                self.gate = None;
                self.reason = Some(why);
                vec![Action::Exit(1)]
            }
            // Before the engines nothing runs that needs stopping: the run ends at once.
            (S::Starting, Input::StopRequested) if early => {
                self.state = S::Stopped;
                self.gate = None;
                self.reason = Some("stop requested".into());
                vec![Action::Exit(0)]
            }
            (S::Failed, Input::AllStopped) => vec![Action::Exit(1)],
            (_, Input::StopRequested) => {
                self.state = S::Stopping;
                self.gate = None;
                self.reason = Some("stop requested".into());
                vec![Action::StopAll { reason: "stop requested".into() }]
            }
            (S::Stopping, Input::AllStopped) => {
                self.state = S::Stopped;
                vec![Action::Exit(0)]
            }
            (S::Starting, Input::HeadReady) => {
                self.state = S::Ready;
                let again = std::mem::replace(&mut self.ever_ready, true);
                if again {
                    vec![Action::ServingAgain]
                } else {
                    Vec::new()
                }
            }
            (S::Ready, Input::Health(false)) => {
                self.state = S::Degraded;
                Vec::new()
            }
            (S::Degraded, Input::Health(true)) => {
                self.state = S::Ready;
                Vec::new()
            }
            (S::Starting | S::Ready | S::Degraded, Input::RankDead { node, why }) => {
                self.fail_or_restart(format!("rank on {node} is gone ({why})"), now, false)
            }
            (S::Starting | S::Ready | S::Degraded, Input::Hung { node, quiet_s }) => {
                self.fail_or_restart(format!("rank on {node} wrote nothing for {quiet_s:.0} s (hang)"), now, true)
            }
            (S::Starting | S::Ready | S::Degraded, Input::StartFailed { node, why }) => {
                self.fail_or_restart(format!("starting {node} failed: {why}"), now, false)
            }
            (S::Restarting, Input::AllStopped) => vec![Action::ScheduleRestart { delay_s: self.backoff(now) }],
            (S::Restarting, Input::RestartDue) => {
                self.state = S::Starting;
                self.gate = Some(Gate::Engines);
                vec![Action::StartAll]
            }
            // Anything else (late health results, duplicate reports) changes nothing.
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead() -> Input {
        Input::RankDead { node: "w".into(), why: "exit 137".into() }
    }

    #[test]
    fn normal_life() {
        let mut m = Machine::new(Policy::default());
        assert!(m.step(Input::HeadReady, 0.0).is_empty());
        assert_eq!(m.state, State::Ready);
        m.step(Input::Health(false), 1.0);
        assert_eq!(m.state, State::Degraded);
        m.step(Input::Health(true), 2.0);
        assert_eq!(m.state, State::Ready);
        assert_eq!(m.step(Input::StopRequested, 3.0), vec![Action::StopAll { reason: "stop requested".into() }]);
        assert_eq!(m.step(Input::AllStopped, 4.0), vec![Action::Exit(0)]);
        assert_eq!(m.state, State::Stopped);
    }

    #[test]
    fn dead_rank_restarts_whole_job_with_backoff() {
        let mut m = Machine::new(Policy::default());
        m.step(Input::HeadReady, 0.0);
        let a = m.step(dead(), 10.0);
        assert!(matches!(&a[..], [Action::StopAll { reason }] if reason.contains("rank on w is gone")));
        assert_eq!(m.state, State::Restarting);
        assert_eq!(m.step(Input::AllStopped, 11.0), vec![Action::ScheduleRestart { delay_s: 5.0 }]);
        assert_eq!(m.step(Input::RestartDue, 16.0), vec![Action::StartAll]);
        assert_eq!(m.state, State::Starting);
        m.step(dead(), 20.0);
        assert_eq!(m.step(Input::AllStopped, 21.0), vec![Action::ScheduleRestart { delay_s: 10.0 }]);
    }

    #[test]
    fn boot_failure_fails_at_once() {
        let mut m = Machine::new(Policy::default());
        let a = m.step(Input::StartFailed { node: "h".into(), why: "port in use".into() }, 1.0);
        assert_eq!(m.state, State::Failed);
        assert!(matches!(&a[..], [Action::StopAll { reason }] if reason.contains("never became ready")));
        assert_eq!(m.step(Input::AllStopped, 2.0), vec![Action::Exit(1)]);
    }

    #[test]
    fn hang_dumps_stacks_first() {
        let mut m = Machine::new(Policy::default());
        m.step(Input::HeadReady, 0.0);
        let a = m.step(Input::Hung { node: "h".into(), quiet_s: 420.0 }, 500.0);
        assert_eq!(a[0], Action::DumpStacks);
        assert!(matches!(&a[1], Action::StopAll { reason } if reason.contains("hang")));
    }

    #[test]
    fn too_many_restarts_fail() {
        let mut m = Machine::new(Policy { max_restarts: 2, ..Policy::default() });
        m.step(Input::HeadReady, 0.0);
        for t in [0.0, 100.0] {
            m.step(dead(), t);
            m.step(Input::AllStopped, t + 1.0);
            m.step(Input::RestartDue, t + 10.0);
            m.step(Input::HeadReady, t + 20.0);
        }
        let a = m.step(dead(), 200.0);
        assert_eq!(m.state, State::Failed);
        assert!(matches!(&a[..], [Action::StopAll { reason }] if reason.contains("giving up after 2 restarts")));
        assert_eq!(m.step(Input::AllStopped, 201.0), vec![Action::Exit(1)]);
        // Outside the window the count starts again.
        let mut m = Machine::new(Policy { max_restarts: 1, window_s: 60.0, ..Policy::default() });
        m.step(Input::HeadReady, 0.0);
        m.step(dead(), 0.0);
        m.step(Input::AllStopped, 1.0);
        m.step(Input::RestartDue, 6.0);
        m.step(dead(), 100.0);
        assert_eq!(m.state, State::Restarting);
    }

    #[test]
    fn the_gates_in_order_then_booting() {
        let mut m = Machine::new(Policy::default());
        let all = [Gate::Agents, Gate::Replace, Gate::Preflight, Gate::Weights, Gate::Engines];
        assert_eq!(m.begin(&all), vec![Action::RunGate(Gate::Agents)]);
        assert!(m.step(Input::GatePassed(Gate::Weights), 0.0).is_empty(), "not the gate in progress");
        for w in all.windows(2) {
            assert_eq!(m.step(Input::GatePassed(w[0]), 0.0), vec![Action::RunGate(w[1])]);
            assert_eq!((m.state, m.gate), (State::Starting, Some(w[1])));
        }
        assert!(m.step(Input::GatePassed(Gate::Engines), 0.0).is_empty());
        assert_eq!((m.state, m.gate), (State::Starting, None));
        m.step(Input::HeadReady, 1.0);
        assert_eq!(m.state, State::Ready);
    }

    #[test]
    fn a_gate_that_fails_ends_the_run_and_a_stop_at_a_gate_ends_it_at_once() {
        for gate in [Gate::Agents, Gate::Replace, Gate::Preflight, Gate::Weights] {
            let mut m = Machine::new(Policy::default());
            m.begin(&[gate, Gate::Engines]);
            let a = m.step(Input::GateFailed { gate, why: "no".into() }, 0.0);
            assert_eq!((a, m.state, m.reason.as_deref()), (vec![Action::Exit(1)], State::Failed, Some("no")));
            let mut m = Machine::new(Policy::default());
            m.begin(&[gate, Gate::Engines]);
            assert_eq!(m.step(Input::StopRequested, 0.0), vec![Action::Exit(0)]);
            assert_eq!((m.state, m.gate), (State::Stopped, None));
        }
        // Once engines are being started, a stop stops them first.
        let mut m = Machine::new(Policy::default());
        m.begin(&[Gate::Engines]);
        assert_eq!(m.step(Input::StopRequested, 0.0), vec![Action::StopAll { reason: "stop requested".into() }]);
        assert_eq!(m.state, State::Stopping);
        // A failed start while the engines gate runs is a boot failure.
        let mut m = Machine::new(Policy::default());
        m.begin(&[Gate::Engines]);
        m.step(Input::StartFailed { node: "w".into(), why: "x".into() }, 0.0);
        assert_eq!((m.state, m.gate), (State::Failed, None));
    }

    #[test]
    fn ready_after_a_restart_says_serving_again() {
        let mut m = Machine::new(Policy::default());
        m.begin(&[Gate::Engines]);
        m.step(Input::GatePassed(Gate::Engines), 0.0);
        assert!(m.step(Input::HeadReady, 0.0).is_empty(), "the first ready is up's banner, not 'again'");
        m.step(dead(), 10.0);
        m.step(Input::AllStopped, 11.0);
        m.step(Input::RestartDue, 20.0);
        m.step(Input::GatePassed(Gate::Engines), 21.0);
        assert_eq!(m.step(Input::HeadReady, 30.0), vec![Action::ServingAgain]);
    }

    #[test]
    fn stop_during_restart_and_late_inputs() {
        let mut m = Machine::new(Policy::default());
        m.step(Input::HeadReady, 0.0);
        m.step(dead(), 0.0);
        m.step(Input::StopRequested, 1.0);
        assert_eq!(m.state, State::Stopping);
        assert!(m.step(Input::Health(true), 2.0).is_empty());
        assert!(m.step(Input::StopRequested, 2.0).is_empty());
        assert_eq!(m.step(Input::AllStopped, 3.0), vec![Action::Exit(0)]);
    }
}
