//! The guard's sampling side: the files it keeps open (meminfo, PSI, `/proc`, NVML, a
//! container's cgroup), the process table and the attribution of one window. [`super::guard`]
//! runs the loop over these; [`super::responder`] acts on the verdicts.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::attribution::{Attribution, Members, Table, BUCKETS};
use super::config::GuardConfig;
use super::engine::{CgroupWatch, EngineRef, EngineSource};
use super::events::{GuardError, GuardEvent, GuardReporter, GuardStatus};
use super::gate::{check_oom_score_adj, OomAdjCheck};
use super::meminfo::{self, Meminfo};
use super::nvml::Nvml;
use super::pagecache;
use super::procs::ProcDir;
use super::psi;
use super::psi::{Pressure, Trigger};

/// Most GPU processes kept from one NVML query.
const GPU_PROCS: usize = 4096;
/// The fastest fall the sampling rate plans for, bytes per second.
const ASSUMED_MAX_FALL: f64 = 8.0 * (1u64 << 30) as f64;
/// The memory guard. Build with [`Guard::new`], run with [`Guard::run`] on its own thread.
pub struct Guard {
    pub(super) cfg: GuardConfig,
    pub(super) engine: Box<dyn EngineSource>,
    pub(super) receipts: PathBuf,
    pub(super) reporter: Arc<dyn GuardReporter>,
    pub(super) status: Arc<GuardStatus>,
    pub(super) meminfo: File,
    pub(super) meminfo_buf: Box<[u8; 8192]>,
    pub(super) procs: ProcDir,
    pub(super) table: Table,
    pub(super) psi: Option<Trigger>,
    pub(super) psi_note: Option<String>,
    pub(super) psi_file: Option<File>,
    /// NVML, when the driver's library loads; else why not.
    pub(super) nvml: Option<Nvml>,
    pub(super) nvml_note: String,
    /// `(pid, GPU bytes)` from the last NVML query (preallocated).
    pub(super) gpu_mem: Vec<(i32, u64)>,
    pub(super) model_files: Vec<PathBuf>,
    /// MemAvailable at the start of each bucket.
    pub(super) avail_hist: [u64; BUCKETS],
    /// The container engine's cgroup, while the engine is a container.
    pub(super) cgroup: Option<CgroupWatch>,
    /// The engine at the last look.
    pub(super) current: Option<EngineRef>,
}

pub(super) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { nix::libc::sysconf(nix::libc::_SC_PAGESIZE) };
    u64::try_from(v).ok().filter(|&v| v > 0).unwrap_or(4096)
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Guard {
    /// Open every file the loop needs and allocate its buffers.
    pub fn new(
        cfg: GuardConfig,
        engine: Box<dyn EngineSource>,
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
            Err(e) => (None, e.to_string()),
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
            cgroup: None,
            current: None,
        };
        if g.read_meminfo().is_none() {
            return Err(GuardError::Meminfo { path: mpath });
        }
        g.status.restart_allowed.store(true, Ordering::Relaxed);
        Ok(g)
    }

    pub(super) fn read_meminfo(&mut self) -> Option<Meminfo> {
        let n = self.meminfo.read_at(&mut self.meminfo_buf[..], 0).ok()?;
        meminfo::parse(&self.meminfo_buf[..n])
    }

    pub(super) fn read_pressure(&mut self) -> Option<Pressure> {
        let f = self.psi_file.as_ref()?;
        let mut buf = [0u8; 256];
        let n = f.read_at(&mut buf, 0).ok()?;
        psi::parse(&buf[..n])
    }

    pub(super) fn scan(&mut self, bucket: u64, last_bucket: u64) {
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
        if let Some(w) = self.cgroup.as_mut() {
            w.read();
            if bucket > last_bucket {
                w.mark((last_bucket + 1).max(bucket.saturating_sub(BUCKETS as u64 - 1)), bucket);
            }
        }
    }

    pub(super) fn gpu_source(&self) -> &'static str {
        if self.nvml.is_some() {
            "nvml (RSS + per-process GPU memory)"
        } else {
            "none (RSS only)"
        }
    }

    pub(super) fn attribute(&self, bucket: u64, engine: Option<EngineRef>) -> Attribution {
        let scope = self.cfg.victims_under;
        let eligible = |t: &Table, pid: i32| scope.is_none_or(|root| t.descends_from(pid, root));
        match (engine, self.cgroup.as_ref()) {
            (Some(EngineRef::Container { id, pid }), Some(w)) => {
                let mut a =
                    self.table.attribute_members(bucket, Some(Members::Pids { id: pid, pids: &w.members }), eligible);
                if let Some(g) = a.engine.as_mut() {
                    // The cgroup sees every byte charged to the container, RSS or not.
                    g.resident_bytes = w.charged;
                    g.grown_bytes = w.grown(bucket);
                    g.container = Some(id);
                }
                a
            }
            (Some(EngineRef::Container { .. }), None) => self.table.attribute_members(bucket, None, eligible),
            (e, _) => self.table.attribute(bucket, e.map(|e| e.id()), eligible),
        }
    }

    /// Members of the engine per the last scan.
    pub(super) fn engine_members(&self, engine: EngineRef, mut f: impl FnMut(i32)) {
        match (engine, self.cgroup.as_ref()) {
            (EngineRef::Container { .. }, Some(w)) => w.members.iter().for_each(|&p| f(p)),
            (EngineRef::Container { .. }, None) => {}
            (EngineRef::Group(g), _) => self.table.for_each_member(g, f),
        }
    }

    pub(super) fn oom_check(&mut self, engine: EngineRef) -> OomAdjCheck {
        let mut pids = Vec::new();
        self.engine_members(engine, |p| pids.push(p));
        let texts: Vec<(i32, Option<String>)> = pids
            .iter()
            .map(|&p| (p, self.procs.with_file(p, "oom_score_adj", |b| String::from_utf8_lossy(b).into_owned())))
            .collect();
        let refs: Vec<(i32, Option<&str>)> = texts.iter().map(|(p, t)| (*p, t.as_deref())).collect();
        check_oom_score_adj(&refs)
    }

    /// The engine changed (started, restarted, stopped): watch its cgroup if it is a container,
    /// and check its `oom_score_adj`.
    pub(super) fn engine_changed(&mut self, engine: Option<EngineRef>) {
        self.current = engine;
        self.cgroup = None;
        if let Some(EngineRef::Container { id, pid }) = engine {
            match CgroupWatch::open(&self.cfg.proc_root, &self.cfg.cgroup_root, pid) {
                Ok(w) => self.cgroup = Some(w),
                Err(e) => {
                    self.emit(&GuardEvent::Note {
                        message: format!("container {}: its memory cgroup cannot be watched ({e}); its processes are not attributed to the engine", id.as_str()),
                    });
                }
            }
        }
        if let Some(e) = engine {
            let check = self.oom_check(e);
            self.emit(&GuardEvent::OomScoreAdj { pgid: e.id(), check });
        }
    }

    pub(super) fn harden(&self) -> (bool, Vec<String>) {
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

    pub(super) fn emit(&self, e: &GuardEvent) {
        self.reporter.event(e);
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
