//! The guard's hot path allocates nothing: reading `/proc/meminfo` into the preallocated buffer,
//! scanning `/proc` into the preallocated table, attributing growth and deciding are run under a
//! counting global allocator (this test binary's own) and must count zero allocations. With a
//! memory cgroup of its own to watch (the docker engine's path), its re-read counts too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use spark_kit::kit::schema::GuardPolicy;
use spark_kit::memguard::attribution::Table;
use spark_kit::memguard::engine::CgroupWatch;
use spark_kit::memguard::meminfo;
use spark_kit::memguard::policy::{decide, Floors};
use spark_kit::memguard::procs::ProcDir;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn sample_scan_attribute_decide_allocate_nothing() {
    // Set-up may allocate (Guard::new does the same).
    let meminfo_file = File::open("/proc/meminfo").unwrap();
    let mut buf = Box::new([0u8; 8192]);
    let mut procs = ProcDir::open(std::path::Path::new("/proc")).unwrap();
    let mut table = Table::new(4096);
    let floors = Floors {
        soft: u64::MAX / 2,
        hard: u64::MAX / 4,
        policy: GuardPolicy::KillOffender,
        min_blame: 1,
        unattributed_is_engine: true,
    };
    let sacrificable = vec!["hf-upload".to_string()];
    let me = nix::unistd::getpgrp().as_raw();
    let pid = i32::try_from(std::process::id()).unwrap();
    let mut watch = CgroupWatch::open(std::path::Path::new("/proc"), std::path::Path::new("/sys/fs/cgroup"), pid)
        .map_err(|e| eprintln!("not counting the cgroup watch: {e}"))
        .ok();
    // One warm-up turn (first use of lazily initialised libc state).
    let mut turn = |bucket: u64, last: u64| {
        let n = meminfo_file.read_at(&mut buf[..], 0).unwrap();
        let m = meminfo::parse(&buf[..n]).unwrap();
        table.begin();
        procs.for_each_stat(|s| table.add(s, 0, bucket));
        table.end(bucket, last);
        if let Some(w) = watch.as_mut() {
            w.read();
        }
        let a = table.attribute(bucket, Some(me), |t, pid| t.descends_from(pid, 1));
        decide(&floors, m.mem_available, 1 << 30, &a, &sacrificable)
    };
    let _ = turn(0, 0);

    COUNTING.store(true, Ordering::SeqCst);
    let mut decisions = 0;
    for bucket in 1..50 {
        let d = turn(bucket, bucket - 1);
        decisions += usize::from(d.name() != "idle");
    }
    COUNTING.store(false, Ordering::SeqCst);

    assert_eq!(ALLOCATIONS.load(Ordering::SeqCst), 0, "the hot path allocated");
    // Floors above any real MemAvailable: every turn is a hard-floor decision.
    assert_eq!(decisions, 49);
    assert!(!table.is_empty());
    if let Some(w) = &watch {
        assert!(w.members.contains(&pid), "the watch of this process's own cgroup lacks it: {:?}", w.members);
    }
}
