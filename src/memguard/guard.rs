//! The guard loop: sample `/proc/meminfo` (10 Hz, faster as the floor nears), wake at once on a
//! PSI trigger, attribute growth ([`super::sampler`]), decide (pure, [`super::policy`]), act and
//! write a receipt ([`super::responder`]).
//!
//! Hot path = read meminfo → scan `/proc` (and a container engine's cgroup) → decide →
//! `kill`/`killpg`/`docker kill`. It runs on buffers allocated in [`Guard::new`]; events,
//! receipts and cache drops come after the signal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::attribution::BUCKETS;
use super::config::MIB;
use super::events::{GuardEvent, GuardStatus};
use super::gate::{restart_gate, Gate};
use super::meminfo::Meminfo;
use super::policy::{decide, Decision, Floors};
use super::receipt;
use super::responder::{policy_name, Action, Target};
use super::sampler::{next_wait, Guard};

/// A `/proc` scan this recent is good enough to decide on at the hard floor.
const FRESH_SCAN: Duration = Duration::from_millis(50);
/// Near the floors, `/proc` is scanned at most this often.
const NEAR_SCAN: Duration = Duration::from_millis(20);

impl Guard {
    /// Live numbers, shared with the host.
    #[must_use]
    pub fn status(&self) -> Arc<GuardStatus> {
        Arc::clone(&self.status)
    }

    pub fn run(&mut self, stop: &AtomicBool) {
        let (locked, notes) = if self.cfg.harden { self.harden() } else { (false, Vec::new()) };
        let start = Instant::now();
        let bucket_len = (self.cfg.window / u32::try_from(BUCKETS).unwrap_or(8)).max(Duration::from_millis(10));
        let first = self.read_meminfo().unwrap_or_default();
        let engine = self.engine.engine();
        let baseline = self.cfg.idle_baseline.or(engine.is_none().then_some(first.mem_available));
        self.avail_hist = [first.mem_available; BUCKETS];
        self.scan(0, 0);
        self.emit(&GuardEvent::Started {
            node: self.cfg.node.clone(),
            policy: policy_name(self.cfg.policy),
            soft_floor: self.cfg.soft_floor,
            hard_floor: self.cfg.hard_floor,
            mem_available: first.mem_available,
            mem_free: first.mem_free,
            psi: self.psi.as_ref().map_or_else(|| "none".to_string(), |t| t.spec.clone()),
            memory_locked: locked,
            gpu_memory_source: self.gpu_source(),
            baseline,
            max_interval_ms: u64::try_from(self.cfg.interval.as_millis()).unwrap_or(u64::MAX),
            receipts: self.receipts.clone(),
        });
        for message in notes.into_iter().chain(self.psi_note.take()) {
            self.emit(&GuardEvent::Note { message });
        }
        self.emit(&GuardEvent::Note {
            message: if self.nvml.is_some() {
                self.nvml_note.clone()
            } else if self.cfg.engine_on_gpu {
                format!("per-process GPU memory: NVML unavailable ({}); attribution is RSS only, and a fall no RSS explains is counted as the engine's (GB10 driver memory)", self.nvml_note)
            } else {
                "attribution is RSS only (the engine runs on the CPU, so its memory is all in RSS)".into()
            },
        });
        self.engine_changed(engine);

        let mut last_bucket = 0u64;
        let mut last_scan = Instant::now();
        let mut last = (Instant::now(), first.mem_available);
        let mut fall_rate = 0.0f64; // bytes per second, smoothed
        let mut wait = self.cfg.interval;
        let mut crossing: Option<(Instant, Meminfo)> = None;
        let mut soft_armed = true;
        let mut no_action_reported = false;
        let mut action: Option<Action> = None;
        let mut settle_until = Instant::now();
        let mut gate_pending = false;

        while !stop.load(Ordering::Relaxed) {
            match &self.psi {
                Some(t) => {
                    if t.wait(wait).is_err() {
                        self.psi = None;
                        self.emit(&GuardEvent::Note {
                            message: "the PSI trigger failed; plain sampling from now on".into(),
                        });
                    }
                }
                None => std::thread::sleep(wait),
            }
            let Some(m) = self.read_meminfo() else { continue };
            let now = Instant::now();
            self.status.mem_available.store(m.mem_available, Ordering::Relaxed);
            self.status.mem_free.store(m.mem_free, Ordering::Relaxed);

            // Sampling rate: 10 Hz, faster when the floor is near at the current rate of fall.
            let dt = now.duration_since(last.0).as_secs_f64().max(1e-4);
            #[allow(clippy::cast_precision_loss)]
            let inst = (last.1 as f64 - m.mem_available as f64) / dt;
            fall_rate = if inst > fall_rate { inst } else { 0.7 * fall_rate + 0.3 * inst };
            last = (now, m.mem_available);
            let headroom = m.mem_available.saturating_sub(self.cfg.hard_floor);
            wait = next_wait(headroom, fall_rate, self.cfg.min_interval, self.cfg.interval);

            let bucket =
                u64::try_from(now.duration_since(start).as_nanos() / bucket_len.as_nanos().max(1)).unwrap_or(u64::MAX);
            if bucket > last_bucket {
                let from = (last_bucket + 1).max(bucket.saturating_sub(BUCKETS as u64 - 1));
                for b in from..=bucket {
                    self.avail_hist[usize::try_from(b % BUCKETS as u64).unwrap_or(0)] = m.mem_available;
                }
            }
            let near = m.mem_available <= self.cfg.soft_floor || wait < self.cfg.interval;
            // At the hard floor with a table from the last few milliseconds (near the floor every
            // sample scans), act on it first: the next turn scans while the victim exits.
            let act_first = action.is_none()
                && m.mem_available <= self.cfg.hard_floor
                && now >= settle_until
                && now.duration_since(last_scan) < FRESH_SCAN;
            if !act_first
                && (action.is_some()
                    || (near && now.duration_since(last_scan) >= NEAR_SCAN)
                    || now.duration_since(last_scan) >= self.cfg.scan_interval
                    || bucket > last_bucket)
            {
                self.scan(bucket, last_bucket);
                last_bucket = bucket;
                last_scan = now;
            }

            let engine = self.engine.engine();
            if engine != self.current {
                self.engine_changed(engine);
            }

            if let Some(act) = action.as_mut() {
                if self.progress(act, &m, now) {
                    let act = action.take();
                    if let Some(act) = act {
                        if matches!(act.target, Target::Group(_) | Target::Container { .. }) {
                            gate_pending = true;
                            self.status.restart_allowed.store(false, Ordering::Relaxed);
                        }
                        self.finish(act, &m);
                    }
                    settle_until = now + Duration::from_millis(500);
                    crossing = None;
                }
                continue;
            }

            if gate_pending {
                if let Some(b) = baseline {
                    let gate = restart_gate(m.mem_available, b, self.cfg.baseline_tolerance);
                    if matches!(gate, Gate::Open { .. }) {
                        gate_pending = false;
                        self.status.restart_allowed.store(true, Ordering::Relaxed);
                        self.emit(&GuardEvent::RestartGate { gate });
                    }
                }
            }

            if m.mem_available > self.cfg.hard_floor {
                crossing = None;
                no_action_reported = false;
            }
            if m.mem_available > self.cfg.soft_floor.saturating_add(256 * MIB) {
                soft_armed = true;
            }
            if m.mem_available > self.cfg.soft_floor || now < settle_until {
                continue;
            }
            let crossed =
                if m.mem_available <= self.cfg.hard_floor { *crossing.get_or_insert((now, m)) } else { (now, m) };
            let drop = self.avail_hist[usize::try_from((bucket + 1) % BUCKETS as u64).unwrap_or(0)]
                .saturating_sub(m.mem_available);
            let a = self.attribute(bucket, self.current);
            let floors = Floors {
                soft: self.cfg.soft_floor,
                hard: self.cfg.hard_floor,
                policy: self.cfg.policy,
                min_blame: self.cfg.min_blame,
                unattributed_is_engine: self.cfg.engine_on_gpu && self.nvml.is_none(),
            };
            let d = decide(&floors, m.mem_available, drop, &a, &self.cfg.sacrificable);
            match d {
                Decision::Idle => {}
                Decision::Soft => {
                    if soft_armed {
                        soft_armed = false;
                        self.soft(&m, &a, drop, bucket_len);
                    }
                }
                Decision::Off | Decision::NoVictim => {
                    if !no_action_reported {
                        no_action_reported = true;
                        let r = self.receipt(d, &crossed.1, &m, &a, drop, bucket_len);
                        let path = receipt::write(&self.receipts, &r).ok();
                        self.emit(&GuardEvent::NoAction {
                            decision: d.name(),
                            mem_available: m.mem_available,
                            receipt: path,
                        });
                    }
                }
                Decision::StopEngine { .. } | Decision::KillProcess { .. } => {
                    action = self.act(d, crossed, &m, &a, drop, bucket_len);
                }
            }
        }
        self.emit(&GuardEvent::Stopped);
    }
}
