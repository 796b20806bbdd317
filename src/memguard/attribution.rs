//! Who grew, by how much, over the last window: the engine's process group against every other
//! process. The table is preallocated and kept sorted by pid; updating it never allocates.
//!
//! Resident memory per process is RSS plus, where a GPU source is present (NVML per-process
//! figures work on GB10), its GPU memory. Without one, GB10 driver memory is invisible per
//! process and shows up only as the window's *unattributed* fall of MemAvailable.

use serde::Serialize;

use super::procs::{Comm, ProcStat};

/// History slots per process; the window is split into this many buckets.
pub const BUCKETS: usize = 8;
/// Most processes tracked; more are counted in [`Table::overflow`] and not attributed.
pub const MAX_PROCS: usize = 16_384;
/// Growers kept in a summary.
pub const TOP: usize = 5;

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    pid: i32,
    starttime: u64,
    pgrp: i32,
    ppid: i32,
    comm: Comm,
    resident: u64,
    /// Resident bytes at the start of each bucket (ring indexed by bucket number).
    hist: [u64; BUCKETS],
    /// First bucket this process was seen in.
    born: u64,
}

/// One process that grew.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Grower {
    pub pid: i32,
    pub pgrp: i32,
    pub comm: Comm,
    pub resident: u64,
    /// Growth over the window (bytes; the whole size for a process born inside the window).
    pub grown: u64,
}

impl Serialize for Grower {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Grower", 5)?;
        st.serialize_field("pid", &self.pid)?;
        st.serialize_field("pgrp", &self.pgrp)?;
        st.serialize_field("comm", &self.comm.as_str())?;
        st.serialize_field("resident_bytes", &self.resident)?;
        st.serialize_field("grown_bytes", &self.grown)?;
        st.end()
    }
}

/// The engine group's memory and growth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct GroupGrowth {
    /// The process group id, or for a container its main process's pid.
    pub pgid: i32,
    pub processes: u32,
    /// RSS (+ GPU memory) of the members; for a container, its cgroup's charge.
    pub resident_bytes: u64,
    /// Growth over the window; for a container, its cgroup charge's growth.
    pub grown_bytes: u64,
    /// A container's engine: its id (memory attributed by its cgroup).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<super::engine::ContainerId>,
}

/// Who belongs to the engine: a process group, or a container's cgroup members.
#[derive(Debug, Clone, Copy)]
pub enum Members<'a> {
    Group(i32),
    /// `id` names the engine (the container's main pid); `pids` sorted.
    Pids {
        id: i32,
        pids: &'a [i32],
    },
}

impl Members<'_> {
    fn id(&self) -> i32 {
        match self {
            Members::Group(p) | Members::Pids { id: p, .. } => *p,
        }
    }

    fn contains(&self, pid: i32, pgrp: i32) -> bool {
        match self {
            Members::Group(g) => *g == pgrp,
            Members::Pids { pids, .. } => pids.binary_search(&pid).is_ok(),
        }
    }
}

/// The attribution of one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attribution {
    /// The engine group (None when no engine is running).
    pub engine: Option<GroupGrowth>,
    /// Biggest growers outside the engine group, largest first (`count` are valid).
    pub top: [Grower; TOP],
    pub count: usize,
    /// Sum of every process's positive growth.
    pub attributed_bytes: u64,
    /// Processes that could not be tracked (table full).
    pub overflow: u32,
}

impl Attribution {
    /// The valid growers.
    #[must_use]
    pub fn growers(&self) -> &[Grower] {
        &self.top[..self.count]
    }
}

/// The process table: two preallocated buffers, swapped after each scan.
pub struct Table {
    cur: Vec<Entry>,
    next: Vec<Entry>,
    page_size: u64,
    pub overflow: u32,
}

impl Table {
    #[must_use]
    pub fn new(page_size: u64) -> Self {
        Self { cur: Vec::with_capacity(MAX_PROCS), next: Vec::with_capacity(MAX_PROCS), page_size, overflow: 0 }
    }

    /// Start a scan for `bucket` (a number that grows by one every window / [`BUCKETS`]).
    pub fn begin(&mut self) {
        self.next.clear();
        self.overflow = 0;
    }

    /// Add one process seen in the scan that began with [`Table::begin`]. `gpu` is its GPU memory.
    pub fn add(&mut self, s: &ProcStat, gpu: u64, bucket: u64) {
        if s.state == b'Z' {
            return;
        }
        if self.next.len() == self.next.capacity() {
            self.overflow += 1;
            return;
        }
        let resident = s.rss_pages.saturating_mul(self.page_size).saturating_add(gpu);
        let prev = self
            .cur
            .binary_search_by_key(&s.pid, |e| e.pid)
            .ok()
            .map(|i| self.cur[i])
            .filter(|e| e.starttime == s.starttime);
        let e = match prev {
            Some(mut e) => {
                e.pgrp = s.pgrp;
                e.ppid = s.ppid;
                e.comm = s.comm;
                e.resident = resident;
                e
            }
            None => Entry {
                pid: s.pid,
                starttime: s.starttime,
                pgrp: s.pgrp,
                ppid: s.ppid,
                comm: s.comm,
                resident,
                // Until a bucket boundary passes, its base is its size when first seen.
                hist: [resident; BUCKETS],
                born: bucket,
            },
        };
        self.next.push(e);
    }

    /// Finish the scan: keep the table sorted and record the starting size of every bucket
    /// that began since the previous scan (`last_bucket`; pass `bucket` for the first scan).
    pub fn end(&mut self, bucket: u64, last_bucket: u64) {
        self.next.sort_unstable_by_key(|e| e.pid);
        std::mem::swap(&mut self.cur, &mut self.next);
        if bucket <= last_bucket {
            return;
        }
        let first = (last_bucket + 1).max(bucket.saturating_sub(BUCKETS as u64 - 1));
        for e in &mut self.cur {
            for b in first..=bucket {
                e.hist[slot(b)] = e.resident;
            }
        }
    }

    /// Number of live processes in the table.
    #[must_use]
    pub fn len(&self) -> usize {
        self.cur.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.cur.is_empty()
    }

    /// Whether `pid` with `starttime` is still alive per the last scan.
    #[must_use]
    pub fn alive(&self, pid: i32, starttime: u64) -> bool {
        self.cur.binary_search_by_key(&pid, |e| e.pid).is_ok_and(|i| self.cur[i].starttime == starttime)
    }

    /// Start time of `pid` per the last scan.
    #[must_use]
    pub fn starttime(&self, pid: i32) -> Option<u64> {
        self.cur.binary_search_by_key(&pid, |e| e.pid).ok().map(|i| self.cur[i].starttime)
    }

    /// Live members of process group `pgid`.
    #[must_use]
    pub fn group_size(&self, pgid: i32) -> usize {
        self.cur.iter().filter(|e| e.pgrp == pgid).count()
    }

    /// Call `f` with the pid of each member of group `pgid`.
    pub fn for_each_member(&self, pgid: i32, mut f: impl FnMut(i32)) {
        for e in self.cur.iter().filter(|e| e.pgrp == pgid) {
            f(e.pid);
        }
    }

    /// Whether `pid` descends from `ancestor` (or is it), per the last scan.
    #[must_use]
    pub fn descends_from(&self, pid: i32, ancestor: i32) -> bool {
        let mut p = pid;
        for _ in 0..64 {
            if p == ancestor {
                return true;
            }
            match self.cur.binary_search_by_key(&p, |e| e.pid) {
                Ok(i) if self.cur[i].ppid > 0 && self.cur[i].ppid != p => p = self.cur[i].ppid,
                _ => return false,
            }
        }
        false
    }

    /// Attribute growth over the window that ends at `bucket`: the engine group `engine` against
    /// everyone else. `eligible` filters which other processes may be named as growers.
    #[must_use]
    pub fn attribute(&self, bucket: u64, engine: Option<i32>, eligible: impl Fn(&Self, i32) -> bool) -> Attribution {
        self.attribute_members(bucket, engine.map(Members::Group), eligible)
    }

    /// [`Table::attribute`] with the engine given by its members (a process group or a
    /// container's cgroup).
    #[must_use]
    pub fn attribute_members(
        &self,
        bucket: u64,
        engine: Option<Members<'_>>,
        eligible: impl Fn(&Self, i32) -> bool,
    ) -> Attribution {
        let mut a = Attribution { overflow: self.overflow, ..Attribution::default() };
        let oldest = bucket.saturating_sub(BUCKETS as u64 - 1);
        let mut group = engine.map(|m| (m, GroupGrowth { pgid: m.id(), ..GroupGrowth::default() }));
        for e in &self.cur {
            let base = if e.born <= oldest { e.hist[slot(oldest)] } else { 0 };
            let grown = e.resident.saturating_sub(base);
            a.attributed_bytes = a.attributed_bytes.saturating_add(grown);
            if let Some((_, g)) = group.as_mut().filter(|(m, _)| m.contains(e.pid, e.pgrp)) {
                g.processes += 1;
                g.resident_bytes = g.resident_bytes.saturating_add(e.resident);
                g.grown_bytes = g.grown_bytes.saturating_add(grown);
                continue;
            }
            if grown == 0 || !eligible(self, e.pid) {
                continue;
            }
            let g = Grower { pid: e.pid, pgrp: e.pgrp, comm: e.comm, resident: e.resident, grown };
            insert_top(&mut a.top, &mut a.count, g);
        }
        a.engine = group.map(|(_, g)| g).filter(|g| g.processes > 0);
        a
    }
}

fn slot(bucket: u64) -> usize {
    // BUCKETS is small, so the remainder fits in usize.
    usize::try_from(bucket % BUCKETS as u64).unwrap_or(0)
}

fn insert_top(top: &mut [Grower; TOP], count: &mut usize, g: Grower) {
    let pos = top[..*count].iter().position(|t| g.grown > t.grown).unwrap_or(*count);
    if pos >= TOP {
        return;
    }
    let last = (*count).min(TOP - 1);
    top.copy_within(pos..last, pos + 1);
    top[pos] = g;
    *count = (*count + 1).min(TOP);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: i32, pgrp: i32, comm: &str, rss_pages: u64) -> ProcStat {
        ProcStat {
            pid,
            comm: Comm::new(comm.as_bytes()),
            state: b'S',
            ppid: 1,
            pgrp,
            starttime: u64::try_from(pid).unwrap() * 10,
            rss_pages,
        }
    }

    /// Scan a list of processes at `bucket`.
    fn scan(t: &mut Table, bucket: u64, last: u64, procs: &[ProcStat]) {
        let last = if bucket == 0 { 0 } else { last };
        t.begin();
        for p in procs {
            t.add(p, 0, bucket);
        }
        t.end(bucket, last);
    }

    #[test]
    fn names_the_grower_not_the_big_idle_engine() {
        let mut t = Table::new(1);
        let engine = [stat(100, 100, "VLLM::EngineCor", 90_000), stat(101, 100, "VLLM::Worker_TP", 5_000)];
        let idle = stat(200, 200, "sshd", 10);
        for b in 0..BUCKETS as u64 {
            scan(&mut t, b, b.saturating_sub(1), &[engine[0], engine[1], idle, stat(300, 300, "hf-upload", 1_000)]);
        }
        let b = BUCKETS as u64;
        scan(&mut t, b, b - 1, &[engine[0], engine[1], idle, stat(300, 300, "hf-upload", 8_000)]);
        let a = t.attribute(b, Some(100), |_, _| true);
        let e = a.engine.unwrap();
        assert_eq!((e.processes, e.resident_bytes, e.grown_bytes), (2, 95_000, 0));
        assert_eq!(a.growers().len(), 1);
        assert_eq!((a.top[0].pid, a.top[0].grown), (300, 7_000));
        assert_eq!(a.top[0].comm.as_bytes(), b"hf-upload");
    }

    #[test]
    fn a_process_born_in_the_window_counts_whole_and_engine_growth_is_summed() {
        let mut t = Table::new(4096);
        for b in 0..10 {
            let w = 10 + b * 100;
            scan(&mut t, b, b.saturating_sub(1), &[stat(10, 10, "eng", w), stat(11, 10, "eng-w", w)]);
        }
        scan(&mut t, 10, 9, &[stat(10, 10, "eng", 1_010), stat(11, 10, "eng-w", 1_010), stat(50, 50, "hog", 256)]);
        let a = t.attribute(10, Some(10), |_, _| true);
        // Window = buckets 3..=10: growth from 310 to 1010 pages each.
        assert_eq!(a.engine.unwrap().grown_bytes, 2 * 700 * 4096);
        assert_eq!((a.top[0].pid, a.top[0].grown), (50, 256 * 4096));
        assert_eq!(a.attributed_bytes, (2 * 700 + 256) * 4096);
    }

    #[test]
    fn a_container_engine_is_its_cgroup_members_whatever_their_groups() {
        let mut t = Table::new(1);
        // Container members 20 (init) and 21 (its own session), host process 30 in group 20's
        // number space by coincidence: membership is by pid, not by group.
        let procs = |hog| [stat(20, 20, "docker-init", 10), stat(21, 21, "python3", hog), stat(30, 20, "host", 5)];
        for b in 0..BUCKETS as u64 {
            scan(&mut t, b, b.saturating_sub(1), &procs(100));
        }
        let b = BUCKETS as u64;
        scan(&mut t, b, b - 1, &procs(900));
        let a = t.attribute_members(b, Some(Members::Pids { id: 20, pids: &[20, 21] }), |_, _| true);
        let e = a.engine.unwrap();
        assert_eq!((e.pgid, e.processes, e.resident_bytes, e.grown_bytes), (20, 2, 910, 800));
        assert_eq!(a.count, 0, "the host process did not grow and the container is not a grower");
        let by_group = t.attribute(b, Some(20), |_, _| true);
        assert_eq!(by_group.engine.unwrap().processes, 2, "group 20 = pids 20 and 30");
    }

    #[test]
    fn pid_reuse_is_a_new_process_and_filters_apply() {
        let mut t = Table::new(1);
        for b in 0..BUCKETS as u64 {
            scan(&mut t, b, b.saturating_sub(1), &[stat(7, 7, "old", 500)]);
        }
        let mut reused = stat(7, 7, "new", 600);
        reused.starttime = 999;
        let b = BUCKETS as u64;
        scan(&mut t, b, b - 1, &[reused, stat(8, 8, "other", 50)]);
        let a = t.attribute(b, None, |_, _| true);
        assert!(a.engine.is_none());
        assert_eq!((a.top[0].pid, a.top[0].grown), (7, 600));
        let only_8 = t.attribute(b, None, |_, pid| pid == 8);
        assert_eq!((only_8.count, only_8.top[0].pid), (1, 8));
        assert!(!t.alive(7, 70) && t.alive(7, 999));
    }

    #[test]
    fn top_list_keeps_the_largest_in_order() {
        let mut top = [Grower::default(); TOP];
        let mut n = 0;
        for (pid, grown) in [(1, 5), (2, 50), (3, 1), (4, 40), (5, 30), (6, 20), (7, 60)] {
            insert_top(&mut top, &mut n, Grower { pid, grown, ..Grower::default() });
        }
        let order: Vec<i32> = top[..n].iter().map(|g| g.pid).collect();
        assert_eq!(order, [7, 2, 4, 5, 6]);
    }
}
