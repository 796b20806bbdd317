//! The engine's cgroup watch on a real memory cgroup: a process that joins after the watch was
//! opened (what `docker exec` does) must be among the members at the next read. cgroup v1 caches
//! a reader's pid list while the file stays open, so a watch that re-read one open
//! `cgroup.procs` kept the members of its first read (the e2e_docker guard then counted a hog
//! exec'd into the container as a grower outside the engine).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use spark_kit::memguard::cgroup::{self, Version};
use spark_kit::memguard::engine::CgroupWatch;

const ROOT: &str = "/sys/fs/cgroup";

/// A memory cgroup made for the test, its processes killed and the directory removed on drop.
struct TestCgroup {
    dir: PathBuf,
    kids: Vec<Child>,
}

impl TestCgroup {
    fn make() -> Result<Self, String> {
        let controllers = std::fs::read_to_string(Path::new(ROOT).join("cgroup.controllers")).ok();
        let mount = match cgroup::detect(controllers.as_deref()) {
            Version::V1 => Path::new(ROOT).join("memory"),
            Version::V2 => PathBuf::from(ROOT),
        };
        let dir = mount.join(format!("spark-kit-test-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot make a memory cgroup {} ({e})", dir.display()))?;
        Ok(Self { dir, kids: Vec::new() })
    }

    fn join_new(&mut self) -> i32 {
        let kid = Command::new("sleep").arg("60").spawn().unwrap();
        let pid = i32::try_from(kid.id()).unwrap();
        self.kids.push(kid);
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
        pid
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for k in &mut self.kids {
            let _ = k.kill();
            let _ = k.wait();
        }
        let t = Instant::now();
        while std::fs::remove_dir(&self.dir).is_err() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn a_process_that_joins_the_engine_cgroup_later_is_a_member_at_the_next_read() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipping: needs root to make a memory cgroup (CI runs as root)");
        return;
    }
    let mut cg = match TestCgroup::make() {
        Ok(cg) => cg,
        Err(why) => {
            eprintln!("skipping: {why}");
            return;
        }
    };
    let first = cg.join_new();
    let mut w = CgroupWatch::open(Path::new("/proc"), Path::new(ROOT), first).unwrap();
    assert_eq!(w.dir, cg.dir, "the watch found another cgroup");
    assert_eq!(w.members, [first]);
    // Read again within the kernel's pid-list cache time (v1: one second), as every scan does.
    w.read();
    let later = cg.join_new();
    w.read();
    let mut want = vec![first, later];
    want.sort_unstable();
    assert_eq!(w.members, want, "{:?}: a process that joined after the watch opened is missing", w.version);
    eprintln!("cgroup {:?} watch at {}: members {:?}", w.version, w.dir.display(), w.members);
}
