//! The guard loop: sample `/proc/meminfo` (10 Hz, faster as the floor nears), wake at once on a
//! PSI trigger, attribute growth, decide (pure, [`super::policy`]), signal, then write a receipt.
//!
//! Hot path = read meminfo → scan `/proc` → decide → `kill`/`killpg`. It runs on buffers
//! allocated in [`Guard::new`]; events, receipts and cache drops come after the signal.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde::Serialize;

use super::attribution::{Attribution, GroupGrowth, Grower, Table, BUCKETS};
use super::gate::{check_oom_score_adj, restart_gate, Gate, OomAdjCheck, DEFAULT_TOLERANCE};
use super::meminfo::{self, Meminfo};
use super::nvml::Nvml;
use super::pagecache;
use super::policy::{decide, Decision, EngineReason, Floors};
use super::procs::ProcDir;
use super::psi::{self, Pressure, Trigger};
use super::receipt::{self, Outcome, Receipt, SignalSent};
use crate::kit::schema::{GuardPolicy, Kit};

const MIB: u64 = 1 << 20;
/// A `/proc` scan this recent is good enough to decide on at the hard floor.
const FRESH_SCAN: Duration = Duration::from_millis(50);
/// Near the floors, `/proc` is scanned at most this often.
const NEAR_SCAN: Duration = Duration::from_millis(20);
/// The fastest fall the sampling rate plans for, bytes per second.
const ASSUMED_MAX_FALL: f64 = 8.0 * (1u64 << 30) as f64;

/// Everything the guard needs to know.
#[derive(Debug, Clone)]
pub struct GuardConfig {
    /// Node name, for receipts.
    pub node: String,
    pub soft_floor: u64,
    pub hard_floor: u64,
    pub policy: GuardPolicy,
    /// Process names (`comm`; `prefix*`) that may be killed to save the engine.
    pub sacrificable: Vec<String>,
    /// Model directories or files whose page cache the soft floor drops.
    pub model_paths: Vec<PathBuf>,
    /// Growth below this over the window does not make a process "the one that grew".
    pub min_blame: u64,
    /// Attribution window.
    pub window: Duration,
    /// Longest time between two samples (100 ms = 10 Hz).
    pub interval: Duration,
    /// Shortest time between two samples, used when the projected time to the floor is short.
    pub min_interval: Duration,
    /// Time between `/proc` scans while far from the floors.
    pub scan_interval: Duration,
    /// SIGTERM → SIGKILL for the engine group.
    pub drain: Duration,
    /// SIGTERM → SIGKILL for another process.
    pub kill_grace: Duration,
    /// MemAvailable of the idle node; default: measured at start when no engine runs.
    pub idle_baseline: Option<u64>,
    /// A restart is allowed within this distance of the baseline.
    pub baseline_tolerance: u64,
    /// Only processes descending from this pid may be killed as offenders (a safety scope
    /// for shared hosts and tests); the engine group is always eligible.
    pub victims_under: Option<i32>,
    /// `mlockall`, `oom_score_adj -1000` and nice −20 for this process, where permitted.
    pub harden: bool,
    /// The engine uses a GB10 GPU (unified memory): a fall no process's RSS explains is counted as
    /// the engine's. False for CPU kits, whose engine memory is all in RSS.
    pub engine_on_gpu: bool,
    /// `/proc` (tests point it elsewhere only for the parsers; the loop needs the real one).
    pub proc_root: PathBuf,
}

impl GuardConfig {
    /// The kit's `memory.guard` for node `node`, with the defaults for the rest.
    #[must_use]
    pub fn from_kit(kit: &Kit, node: &str) -> Self {
        let g = &kit.memory.guard;
        Self {
            node: node.to_string(),
            soft_floor: g.soft_floor.bytes(),
            hard_floor: g.hard_floor.bytes(),
            policy: g.policy,
            sacrificable: g.sacrificable.clone(),
            model_paths: kit.model.path.iter().map(PathBuf::from).collect(),
            drain: Duration::from_secs(u64::from(kit.engine.shutdown_timeout_s.clamp(1, 10))),
            engine_on_gpu: crate::node::preflight::kit_needs_gpu(kit),
            ..Self::default()
        }
    }
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            node: "local".into(),
            soft_floor: 4 << 30,
            hard_floor: 2560 * MIB,
            policy: GuardPolicy::ProtectHost,
            sacrificable: Vec::new(),
            model_paths: Vec::new(),
            min_blame: 256 * MIB,
            window: Duration::from_secs(5),
            interval: Duration::from_millis(100),
            min_interval: Duration::from_millis(5),
            scan_interval: Duration::from_millis(500),
            drain: Duration::from_secs(5),
            kill_grace: Duration::from_secs(2),
            idle_baseline: None,
            baseline_tolerance: DEFAULT_TOLERANCE,
            victims_under: None,
            harden: true,
            engine_on_gpu: true,
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// Where the engine's process group is now (it changes when the engine restarts).
pub trait EnginePgid: Send {
    fn pgid(&self) -> Option<i32>;
}

impl<F: Fn() -> Option<i32> + Send> EnginePgid for F {
    fn pgid(&self) -> Option<i32> {
        self()
    }
}

/// Receives the guard's events (the node agent forwards them; the `guard` command prints them).
pub trait GuardReporter: Send + Sync {
    fn event(&self, event: &GuardEvent);
}

/// What the guard reports.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum GuardEvent {
    Started {
        node: String,
        policy: &'static str,
        soft_floor: u64,
        hard_floor: u64,
        mem_available: u64,
        mem_free: u64,
        /// The PSI trigger registered, or why there is none.
        psi: String,
        memory_locked: bool,
        gpu_memory_source: &'static str,
        baseline: Option<u64>,
        max_interval_ms: u64,
        receipts: PathBuf,
    },
    /// A one-time note (PSI absent, mlockall refused, …).
    Note {
        message: String,
    },
    /// The engine group's `oom_score_adj` was checked (on every new engine group).
    OomScoreAdj {
        pgid: i32,
        check: OomAdjCheck,
    },
    /// Below the soft floor: cache dropped, top growers named.
    SoftFloor {
        mem_available: u64,
        growers: Vec<Grower>,
        cache_dropped: usize,
        receipt: Option<PathBuf>,
    },
    /// A signal went out (right after it was sent).
    Acting {
        decision: &'static str,
        reason: String,
        victim: Option<Grower>,
        engine: Option<GroupGrowth>,
        signal: &'static str,
        reaction_ms: f64,
    },
    /// The action ended; its receipt.
    Acted {
        decision: &'static str,
        gone: bool,
        ms: f64,
        receipt: Option<PathBuf>,
        error: Option<String>,
    },
    /// Below the hard floor with policy `off` or nothing to act on (once per crossing).
    NoAction {
        decision: &'static str,
        mem_available: u64,
        receipt: Option<PathBuf>,
    },
    /// After an engine kill: the restart gate.
    RestartGate {
        gate: Gate,
    },
    Stopped,
}

/// Live numbers the host (node agent) can read at any time.
#[derive(Debug, Default)]
pub struct GuardStatus {
    pub mem_available: AtomicU64,
    pub mem_free: AtomicU64,
    pub actions: AtomicU64,
    /// False from an engine kill until MemAvailable is back near the idle baseline.
    pub restart_allowed: AtomicBool,
}

/// Why the guard cannot start.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("memory guard: soft floor {soft} B is below the hard floor {hard} B")]
    Floors { soft: u64, hard: u64 },
    #[error("memory guard: cannot open {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("memory guard: {path} has no MemTotal/MemFree/MemAvailable")]
    Meminfo { path: PathBuf },
    #[error("memory guard: cannot create the receipt directory {path}: {source}")]
    Receipts { path: PathBuf, source: std::io::Error },
}

/// An action in progress.
#[derive(Debug, Clone, Copy)]
enum Target {
    Group(i32),
    Process { pid: i32, starttime: u64 },
}

struct Action {
    decision: Decision,
    target: Target,
    started: Instant,
    escalated: bool,
    grace: Duration,
    receipt: Receipt,
    crossing: Instant,
}

/// The memory guard. Build with [`Guard::new`], run with [`Guard::run`] on its own thread.
pub struct Guard {
    cfg: GuardConfig,
    engine: Box<dyn EnginePgid>,
    receipts: PathBuf,
    reporter: Arc<dyn GuardReporter>,
    status: Arc<GuardStatus>,
    meminfo: File,
    meminfo_buf: Box<[u8; 8192]>,
    procs: ProcDir,
    table: Table,
    psi: Option<Trigger>,
    psi_note: Option<String>,
    psi_file: Option<File>,
    /// NVML, when the driver's library loads; else why not.
    nvml: Option<Nvml>,
    nvml_note: String,
    /// `(pid, GPU bytes)` from the last NVML query (preallocated).
    gpu_mem: Vec<(i32, u64)>,
    model_files: Vec<PathBuf>,
    /// MemAvailable at the start of each bucket.
    avail_hist: [u64; BUCKETS],
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { nix::libc::sysconf(nix::libc::_SC_PAGESIZE) };
    u64::try_from(v).ok().filter(|&v| v > 0).unwrap_or(4096)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Guard {
    /// Open every file the loop needs and allocate its buffers.
    pub fn new(
        cfg: GuardConfig,
        engine: Box<dyn EnginePgid>,
        receipt_dir: &Path,
        reporter: Arc<dyn GuardReporter>,
    ) -> Result<Self, GuardError> {
        if cfg.soft_floor < cfg.hard_floor {
            return Err(GuardError::Floors { soft: cfg.soft_floor, hard: cfg.hard_floor });
        }
        let mpath = cfg.proc_root.join("meminfo");
        let meminfo = File::open(&mpath).map_err(|source| GuardError::Open { path: mpath.clone(), source })?;
        let procs =
            ProcDir::open(&cfg.proc_root).map_err(|source| GuardError::Open { path: cfg.proc_root.clone(), source })?;
        std::fs::create_dir_all(receipt_dir)
            .map_err(|source| GuardError::Receipts { path: receipt_dir.to_path_buf(), source })?;
        let ppath = cfg.proc_root.join("pressure/memory");
        let (psi, psi_note) = match Trigger::open(&ppath, Duration::from_millis(100), Duration::from_secs(1)) {
            Ok(t) => (Some(t), None),
            Err(e) => (
                None,
                Some(format!(
                    "no PSI trigger on {} ({e}): plain sampling only, a collapse is seen at the next sample",
                    ppath.display()
                )),
            ),
        };
        let psi_file = File::open(&ppath).ok();
        let model_files = pagecache::model_files(&cfg.model_paths);
        let (nvml, nvml_note) = match Nvml::load() {
            Ok(n) => {
                let note = format!("per-process GPU memory from NVML ({} device(s), API {})", n.devices(), n.api);
                (Some(n), note)
            }
            Err(e) => (None, e),
        };
        let mut g = Self {
            table: Table::new(page_size()),
            cfg,
            engine,
            receipts: receipt_dir.to_path_buf(),
            reporter,
            status: Arc::new(GuardStatus::default()),
            meminfo,
            meminfo_buf: Box::new([0; 8192]),
            procs,
            psi,
            psi_note,
            psi_file,
            model_files,
            nvml,
            nvml_note,
            gpu_mem: Vec::with_capacity(GPU_PROCS),
            avail_hist: [0; BUCKETS],
        };
        if g.read_meminfo().is_none() {
            return Err(GuardError::Meminfo { path: mpath });
        }
        g.status.restart_allowed.store(true, Ordering::Relaxed);
        Ok(g)
    }

    /// Live numbers, shared with the host.
    #[must_use]
    pub fn status(&self) -> Arc<GuardStatus> {
        Arc::clone(&self.status)
    }

    fn read_meminfo(&mut self) -> Option<Meminfo> {
        let n = self.meminfo.read_at(&mut self.meminfo_buf[..], 0).ok()?;
        meminfo::parse(&self.meminfo_buf[..n])
    }

    fn read_pressure(&mut self) -> Option<Pressure> {
        let f = self.psi_file.as_ref()?;
        let mut buf = [0u8; 256];
        let n = f.read_at(&mut buf, 0).ok()?;
        psi::parse(&buf[..n])
    }

    fn scan(&mut self, bucket: u64, last_bucket: u64) {
        if let Some(n) = self.nvml.as_mut() {
            let gpu = &mut self.gpu_mem;
            gpu.clear();
            // A failed query leaves this scan without GPU figures; RSS still counts.
            let _ = n.for_each_process(|pid, bytes| {
                if gpu.len() < gpu.capacity() {
                    gpu.push((pid, bytes));
                }
            });
        }
        let (table, gpu) = (&mut self.table, &self.gpu_mem);
        table.begin();
        self.procs.for_each_stat(|s| {
            let bytes = gpu.iter().filter(|(p, _)| *p == s.pid).map(|(_, b)| *b).sum();
            table.add(s, bytes, bucket);
        });
        table.end(bucket, last_bucket);
    }

    fn gpu_source(&self) -> &'static str {
        if self.nvml.is_some() {
            "nvml (RSS + per-process GPU memory)"
        } else {
            "none (RSS only)"
        }
    }

    fn attribute(&self, bucket: u64, pgid: Option<i32>) -> Attribution {
        let scope = self.cfg.victims_under;
        self.table.attribute(bucket, pgid, |t, pid| scope.is_none_or(|root| t.descends_from(pid, root)))
    }

    fn oom_check(&mut self, pgid: i32) -> OomAdjCheck {
        let mut pids = Vec::new();
        self.table.for_each_member(pgid, |p| pids.push(p));
        let texts: Vec<(i32, Option<String>)> = pids
            .iter()
            .map(|&p| (p, self.procs.with_file(p, "oom_score_adj", |b| String::from_utf8_lossy(b).into_owned())))
            .collect();
        let refs: Vec<(i32, Option<&str>)> = texts.iter().map(|(p, t)| (*p, t.as_deref())).collect();
        check_oom_score_adj(&refs)
    }

    fn harden(&self) -> (bool, Vec<String>) {
        let mut notes = Vec::new();
        // SAFETY: mlockall has no memory-safety preconditions. MCL_ONFAULT locks pages as they
        // are touched, so the first loop turn (run before arming) pins the hot path.
        let rc =
            unsafe { nix::libc::mlockall(nix::libc::MCL_CURRENT | nix::libc::MCL_FUTURE | nix::libc::MCL_ONFAULT) };
        let locked = rc == 0;
        if !locked {
            notes.push(format!(
                "mlockall refused ({}): the guard's memory may be reclaimed under pressure; run it as root or raise RLIMIT_MEMLOCK",
                std::io::Error::last_os_error()
            ));
        }
        if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-1000") {
            notes.push(format!("cannot set oom_score_adj -1000 on the guard ({e}; needs CAP_SYS_RESOURCE): the kernel OOM killer may pick it"));
        }
        // SAFETY: setpriority has no memory-safety preconditions.
        if unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, 0, -20) } != 0 {
            notes.push(format!(
                "cannot raise the guard's priority to nice -20 ({}; needs CAP_SYS_NICE): wake-ups may lag on a busy host",
                std::io::Error::last_os_error()
            ));
        }
        (locked, notes)
    }

    fn emit(&self, e: &GuardEvent) {
        self.reporter.event(e);
    }

    /// Run until `stop` is set. Blocks; run it on its own thread.
    pub fn run(&mut self, stop: &AtomicBool) {
        let (locked, notes) = if self.cfg.harden { self.harden() } else { (false, Vec::new()) };
        let start = Instant::now();
        let bucket_len = (self.cfg.window / u32::try_from(BUCKETS).unwrap_or(8)).max(Duration::from_millis(10));
        let first = self.read_meminfo().unwrap_or_default();
        let mut pgid = self.engine.pgid();
        let baseline = self.cfg.idle_baseline.or(pgid.is_none().then_some(first.mem_available));
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
        if let Some(p) = pgid {
            let check = self.oom_check(p);
            self.emit(&GuardEvent::OomScoreAdj { pgid: p, check });
        }

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

            let new_pgid = self.engine.pgid();
            if new_pgid != pgid {
                pgid = new_pgid;
                if let Some(p) = pgid {
                    let check = self.oom_check(p);
                    self.emit(&GuardEvent::OomScoreAdj { pgid: p, check });
                }
            }

            if let Some(act) = action.as_mut() {
                if self.progress(act, &m, now) {
                    let act = action.take();
                    if let Some(act) = act {
                        if matches!(act.target, Target::Group(_)) {
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
            let a = self.attribute(bucket, pgid);
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

    /// Send the first signal. The only work before `kill` is reading the start time.
    fn act(
        &mut self,
        d: Decision,
        crossed: (Instant, Meminfo),
        m: &Meminfo,
        a: &Attribution,
        drop: u64,
        bucket_len: Duration,
    ) -> Option<Action> {
        let (target, result) = match d {
            Decision::StopEngine { pgid, .. } => (Target::Group(pgid), killpg(Pid::from_raw(pgid), Signal::SIGTERM)),
            Decision::KillProcess { grower, .. } => {
                let starttime = self.table.starttime(grower.pid).unwrap_or(0);
                (Target::Process { pid: grower.pid, starttime }, kill(Pid::from_raw(grower.pid), Signal::SIGTERM))
            }
            _ => return None,
        };
        let sent = Instant::now();
        // Off the hot path from here: the signal is out.
        self.status.actions.fetch_add(1, Ordering::Relaxed);
        let reaction = ms(sent.duration_since(crossed.0));
        let mut r = self.receipt(d, &crossed.1, m, a, drop, bucket_len);
        r.reaction_ms = Some(reaction);
        r.signals.push(signal_record(target, "SIGTERM", reaction, result.err()));
        let grace = match target {
            Target::Group(_) => self.cfg.drain,
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
        Some(Action { decision: d, target, started: sent, escalated: false, grace, receipt: r, crossing: crossed.0 })
    }

    /// Follow an action; true when it is over (victim gone, or the guard gave up).
    fn progress(&mut self, act: &mut Action, m: &Meminfo, now: Instant) -> bool {
        let gone = match act.target {
            Target::Group(pgid) => self.table.group_size(pgid) == 0,
            Target::Process { pid, starttime } => !self.table.alive(pid, starttime),
        };
        if gone {
            return true;
        }
        let emergency = m.mem_available <= self.cfg.hard_floor / 2;
        if !act.escalated && (now.duration_since(act.started) >= act.grace || emergency) {
            act.escalated = true;
            let result = match act.target {
                Target::Group(pgid) => killpg(Pid::from_raw(pgid), Signal::SIGKILL),
                Target::Process { pid, .. } => kill(Pid::from_raw(pid), Signal::SIGKILL),
            };
            let after = ms(Instant::now().duration_since(act.crossing));
            act.receipt.signals.push(signal_record(act.target, "SIGKILL", after, result.err()));
        }
        now.duration_since(act.started) >= act.grace + Duration::from_secs(10)
    }

    fn finish(&mut self, act: Action, m: &Meminfo) {
        let mut r = act.receipt;
        let mut survivors = Vec::new();
        match act.target {
            Target::Group(pgid) => self.table.for_each_member(pgid, |p| survivors.push(p)),
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

    fn soft(&mut self, m: &Meminfo, a: &Attribution, drop: u64, bucket_len: Duration) {
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

    fn receipt(
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

/// Time to the next sample: `max` (10 Hz) far from the floor; an eighth of the projected time to
/// the hard floor at the current fall rate (bytes/s, smoothed); and never longer than the headroom
/// lasts at 8 GiB/s (GB10 falls of 2–4.5 GiB/s are on record, gb10-ops.md §1.2), so a slow creep
/// across the floor is seen within milliseconds too. Clamped to `min..=max`.
#[must_use]
pub fn next_wait(headroom: u64, fall_rate: f64, min: Duration, max: Duration) -> Duration {
    #[allow(clippy::cast_precision_loss)]
    let by_headroom = headroom as f64 / ASSUMED_MAX_FALL;
    #[allow(clippy::cast_precision_loss)]
    let by_rate = if fall_rate > 0.0 { headroom as f64 / fall_rate / 8.0 } else { f64::MAX };
    Duration::from_secs_f64(by_headroom.min(by_rate).clamp(0.0, 1.0)).clamp(min, max)
}

/// Most GPU processes kept from one NVML query.
const GPU_PROCS: usize = 4096;

fn signal_record(target: Target, signal: &'static str, after: f64, err: Option<nix::errno::Errno>) -> SignalSent {
    let (target, id) = match target {
        Target::Group(p) => ("pgid", p),
        Target::Process { pid, .. } => ("pid", pid),
    };
    SignalSent { signal, target, id, after_crossing_ms: after, error: err.map(|e| e.to_string()) }
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn sampling_speeds_up_as_the_floor_nears() {
        let (min, max) = (5 * MS, 100 * MS);
        // Far away, nothing falling: 10 Hz.
        assert_eq!(next_wait(20 << 30, 0.0, min, max), max);
        // 900 MiB of headroom falling at 1.5 GiB/s: 0.59 s to the floor → an eighth, 73 ms.
        let w = next_wait(900 << 20, 1.5 * f64::from(1u32 << 30), min, max);
        assert!((72 * MS..=74 * MS).contains(&w), "{w:?}");
        // 100 MiB left and nothing falling: bounded by 8 GiB/s → 12 ms.
        let w = next_wait(100 << 20, 0.0, min, max);
        assert!((12 * MS..=13 * MS).contains(&w), "{w:?}");
        // At the floor: the shortest interval.
        assert_eq!(next_wait(0, 1e9, min, max), min);
        assert_eq!(next_wait(0, f64::NAN, min, max), min);
    }
}
