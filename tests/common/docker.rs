//! A real Docker daemon for the tests, started by the tests themselves, and small test images
//! made offline (no registry, no network).
//!
//! - `dockerd` (Debian's docker.io) runs with its own `--data-root`, `--exec-root`, pidfile and
//!   unix socket under a temp dir, `--storage-driver=vfs --iptables=false --bridge=none`, so it
//!   touches nothing of the host's Docker; containers use `--network=host`. Without
//!   `--containerd`, dockerd starts its own containerd under its exec root and stops it on exit.
//! - One daemon per test binary ([`daemon`]), shared by its tests. It is started from a thread
//!   that lives as long as the process, with PR_SET_PDEATHSIG, so a killed test run takes the
//!   daemon (and, as dockerd stops its containers on shutdown, the containers) with it; a normal
//!   exit removes every container, stops the daemon and deletes its directories (atexit).
//! - Images are rootfs tarballs built from the host's own files (Debian's dash, coreutils and
//!   python3, with the shared libraries they load), cached under
//!   `~/.cache/spark-kit/test-images/<name>-<hash>.tar` keyed by a hash of every input file's path,
//!   size and mtime, and brought in with `docker import`. vfs copies the whole image for each
//!   container, so they are kept to a few tens of MB (docs/operations.md, "Docker").
//!
//! Skips (with the reason printed) only when not root or docker.io is not installed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A running test daemon.
pub struct Daemon {
    /// `unix:///…/docker.sock`: pass as `DOCKER_HOST`.
    pub host: String,
    pub dir: PathBuf,
    pid: i32,
}

static DAEMON: OnceLock<Result<Daemon, String>> = OnceLock::new();
/// A second daemon: the "worker node" of image tests.
static WORKER: OnceLock<Result<Daemon, String>> = OnceLock::new();
static STALLED: OnceLock<Result<Daemon, String>> = OnceLock::new();
static CHILDREN: Mutex<Vec<Child>> = Mutex::new(Vec::new());

/// Why docker tests cannot run here (not root, docker.io missing), if they cannot.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root to start dockerd (CI runs as root)".into());
    }
    for b in ["dockerd", "docker", "containerd", "runc"] {
        if which(b).is_none() {
            return Some(format!("`{b}` is not installed (apt-get install docker.io; tests/apt-packages.txt)"));
        }
    }
    None
}

fn which(b: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(b)).find(|p| p.is_file())
}

/// The binary's shared daemon, started on first use. Err = why it cannot run (a skip reason when
/// [`unavailable`] says so; otherwise a failure the test must report).
pub fn daemon() -> Result<&'static Daemon, String> {
    DAEMON.get_or_init(|| start("a")).as_ref().map_err(Clone::clone)
}

/// A second, independent daemon (own roots and socket), for two-node image tests.
pub fn worker_daemon() -> Result<&'static Daemon, String> {
    WORKER.get_or_init(|| start("b")).as_ref().map_err(Clone::clone)
}

/// Held by each test that uses [`stalled_daemon`]: one stalls it at a time.
pub static ONE_STALL: Mutex<()> = Mutex::new(());

/// A daemon no test but those holding [`ONE_STALL`] uses, for a test that stops it ([`Daemon::stall`]).
pub fn stalled_daemon() -> Result<&'static Daemon, String> {
    STALLED.get_or_init(|| start("c")).as_ref().map_err(Clone::clone)
}

/// A daemon stopped with SIGSTOP (accepting connections, answering none) until this is dropped.
pub struct Stalled(i32);

impl Drop for Stalled {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0), nix::sys::signal::Signal::SIGCONT);
    }
}

impl Daemon {
    /// Stop dockerd itself (SIGSTOP; containerd and the containers' shims keep running) until the
    /// returned value is dropped.
    pub fn stall(&self) -> Stalled {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), nix::sys::signal::Signal::SIGSTOP).unwrap();
        Stalled(self.pid)
    }
}

/// The directory and `DOCKER_HOST` of this process's daemon `tag` (known before it starts).
pub fn paths(tag: &str) -> (PathBuf, String) {
    // A short path: the socket path must fit in sun_path (108 bytes).
    let dir = PathBuf::from(format!("/tmp/skd-{}-{tag}", std::process::id()));
    let host = format!("unix://{}/docker.sock", dir.display());
    (dir, host)
}

fn start(tag: &str) -> Result<Daemon, String> {
    let (d, child) = spawn(tag, None)?;
    let first = {
        let mut c = CHILDREN.lock().unwrap();
        c.push(child);
        c.len() == 1
    };
    if first {
        // SAFETY: registering a plain extern "C" fn.
        unsafe { nix::libc::atexit(stop_at_exit) };
    }
    d.wait_answering()?;
    Ok(d)
}

/// `dockerd` with roots under [`paths`]`(tag)`; in network namespace `netns` when given
/// (`nsenter --net`, so its `--network=host` containers get that namespace's interfaces), and
/// then in a mount namespace of its own (host mounts propagate in) with its own /dev/shm.
fn spawn(tag: &str, netns: Option<&str>) -> Result<(Daemon, Child), String> {
    if let Some(why) = unavailable() {
        return Err(why);
    }
    let (dir, host) = paths(tag);
    remove_stale();
    remove_tree(&dir);
    for d in ["data", "exec"] {
        std::fs::create_dir_all(dir.join(d)).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let log = std::fs::File::create(dir.join("dockerd.log")).map_err(|e| e.to_string())?;
    let mut cmd = match netns {
        // Each "node" also gets a /dev/shm of its own, as separate machines have: the
        // containers' `--ipc=host` mounts the daemon's /dev/shm, and vLLM decides which ranks
        // share a node by opening a shared-memory segment (a rank that can would then wait on
        // a ZMQ IPC socket under the other container's /tmp, forever).
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{ns}"));
            c.args(["unshare", "--mount", "--propagation=slave", "sh", "-c"]);
            c.args([r#"mount -t tmpfs -o mode=1777 shm /dev/shm && exec dockerd "$@""#, "dockerd"]);
            c
        }
        None => Command::new("dockerd"),
    };
    cmd.arg(format!("--data-root={}", dir.join("data").display()))
        .arg(format!("--exec-root={}", dir.join("exec").display()))
        .arg(format!("--pidfile={}", dir.join("docker.pid").display()))
        .arg(format!("--host={host}"))
        .args(["--storage-driver=vfs", "--iptables=false", "--ip6tables=false", "--bridge=none"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    // SAFETY: prctl in the child between fork and exec; async-signal-safe. (nsenter, unshare
    // and sh exec one another in the same process, then dockerd: the death signal stays.)
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, nix::libc::SIGTERM);
            Ok(())
        });
    }
    // PDEATHSIG fires when the spawning *thread* ends: spawn from one that never does.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(cmd.spawn());
        loop {
            std::thread::park();
        }
    });
    let child = rx.recv().map_err(|e| e.to_string())?.map_err(|e| format!("cannot start dockerd: {e}"))?;
    let pid = i32::try_from(child.id()).unwrap_or(0);
    Ok((Daemon { host, dir, pid }, child))
}

impl Daemon {
    fn wait_answering(&self) -> Result<(), String> {
        let t = Instant::now();
        while !self.docker(&["info", "--format", "{{.ServerVersion}}"]).status.success() {
            if t.elapsed() > Duration::from_secs(60) {
                let log = std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default();
                return Err(format!("dockerd did not answer within 60 s; its log:\n{log}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("test dockerd up in {:.1} s at {}", t.elapsed().as_secs_f64(), self.host);
        Ok(())
    }
}

/// A daemon of the caller's own, in a network namespace (one per "node" of a two-namespace
/// test): on drop its containers are removed, it is stopped and its directories deleted.
pub struct NsDaemon {
    pub d: Daemon,
    child: Child,
}

impl std::ops::Deref for NsDaemon {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.d
    }
}

/// Start daemon `tag` in network namespace `ns` (which must exist).
pub fn daemon_in(ns: &str, tag: &str) -> Result<NsDaemon, String> {
    let (d, child) = spawn(tag, Some(ns))?;
    let d = NsDaemon { d, child };
    d.wait_answering()?;
    Ok(d)
}

impl Drop for NsDaemon {
    fn drop(&mut self) {
        self.d.remove_all_containers();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.d.pid), nix::sys::signal::Signal::SIGTERM);
        let t = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() {
            if t.elapsed() > Duration::from_secs(20) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        remove_tree(&self.d.dir);
    }
}

extern "C" fn stop_at_exit() {
    for d in [DAEMON.get(), WORKER.get(), STALLED.get()].into_iter().flatten().flatten() {
        d.remove_all_containers();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(d.pid), nix::sys::signal::Signal::SIGTERM);
    }
    if let Ok(mut c) = CHILDREN.lock() {
        for mut c in c.drain(..) {
            let _ = c.wait();
        }
    }
    for d in [DAEMON.get(), WORKER.get(), STALLED.get()].into_iter().flatten().flatten() {
        // vfs layers are plain directories; the exec root holds containerd's state and the
        // bind mount of the default network namespace.
        remove_tree(&d.dir);
    }
}

/// Unmount whatever is mounted under `dir` (dockerd leaves `exec/netns/default`), then remove it.
fn remove_tree(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let prefix = format!("{}/", dir.display());
    for m in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)).filter(|m| m.starts_with(&prefix)) {
        if let Ok(c) = std::ffi::CString::new(m) {
            // SAFETY: a valid NUL-terminated path; umount2 has no other preconditions.
            unsafe { nix::libc::umount2(c.as_ptr(), nix::libc::MNT_DETACH) };
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Directories of earlier test daemons whose test process is gone (killed runs).
fn remove_stale() {
    let Ok(rd) = std::fs::read_dir("/tmp") else { return };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("skd-").and_then(|p| p.split('-').next()?.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove_tree(&e.path());
        }
    }
}

impl Daemon {
    /// `docker …` against this daemon.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new("docker");
        c.env("DOCKER_HOST", &self.host);
        c
    }

    pub fn docker(&self, args: &[&str]) -> std::process::Output {
        self.cmd().args(args).stdin(Stdio::null()).output().expect("run docker")
    }

    /// `docker …` that must succeed; its trimmed stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.docker(args);
        assert!(o.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// Ids of every container (running or not).
    pub fn containers(&self) -> Vec<String> {
        self.ok(&["ps", "-aq", "--no-trunc"]).lines().map(str::to_string).collect()
    }

    /// `docker rm -f` of every container (quietly: also run while tearing down).
    pub fn remove_all_containers(&self) {
        let o = self.docker(&["ps", "-aq", "--no-trunc"]);
        let text = String::from_utf8_lossy(&o.stdout);
        let ids: Vec<&str> = text.lines().collect();
        if o.status.success() && !ids.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(ids);
            let _ = self.docker(&args);
        }
    }

    /// The image `name` (`repo:tag`) imported from `image`'s rootfs; its image id.
    /// `label` makes a distinct image id from the same files (for mismatch tests).
    pub fn import(&self, image: &TestImage, name: &str, label: Option<&str>) -> String {
        let tar = image.tarball();
        let mut args = vec!["import".to_string()];
        if let Some(l) = label {
            args.extend(["--change".to_string(), format!("LABEL spark-kit.test={l}")]);
        }
        args.extend([tar.display().to_string(), name.to_string()]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.ok(&refs);
        self.image_id(name).expect("imported image has an id")
    }

    pub fn image_id(&self, name: &str) -> Option<String> {
        let o = self.docker(&["image", "inspect", "--format", "{{.Id}}", name]);
        o.status.success().then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
    }
}

/// A memory hog for the guard's tests, run with python3 inside a container: `HOG FLOOR MAX
/// [GO]`. With GO, prints `ready` and waits until the file GO exists. Then grows 1 MiB at a time
/// at ~1 GiB/s until 256 MiB past the moment MemAvailable first falls to FLOOR (bytes), or MAX
/// bytes in all; then holds (until the guard stops its container).
pub const HOG: &str = r#"
import os, sys, time
floor, most = int(sys.argv[1]), int(sys.argv[2])
def avail():
    with open("/proc/meminfo", "rb") as f:
        for l in f:
            if l.startswith(b"MemAvailable:"):
                return int(l.split()[1]) * 1024
if len(sys.argv) > 3:
    print("ready", flush=True)
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.01)
chunks, grown, crossed_at, t0 = [], 0, None, time.monotonic()
while grown < most and (crossed_at is None or grown < crossed_at + (256 << 20)):
    chunks.append(b"\x01" * (1 << 20))
    grown += 1 << 20
    if crossed_at is None and avail() <= floor:
        crossed_at = grown
    ahead = grown / (1 << 30) - (time.monotonic() - t0)
    if ahead > 0:
        time.sleep(ahead)
while True:
    time.sleep(1)
"#;

/// vLLM's main process in the container whose pid 1 (`docker-init`, `--init`) is host pid
/// `init`: its one child.
pub fn vllm_main(init: i32) -> i32 {
    let comm = |p: i32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default().trim().to_string();
    assert_eq!(comm(init), "docker-init", "the container's pid 1");
    let kids = super::children_of(init);
    assert_eq!(kids.len(), 1, "docker-init has one child, vLLM: {kids:?}");
    // (vLLM may set its process title: NULs or spaces between the words.)
    let cmdline = std::fs::read_to_string(format!("/proc/{}/cmdline", kids[0])).unwrap_or_default().replace('\0', " ");
    assert!(cmdline.contains("/bin/vllm serve /model"), "not vLLM: {cmdline:?}");
    kids[0]
}

/// A test image: a rootfs of host files.
pub struct TestImage {
    pub name: &'static str,
    /// Executables to copy with the shared libraries they need.
    pub binaries: &'static [&'static str],
    /// Directories copied whole (minus `exclude`).
    pub trees: &'static [&'static str],
    pub exclude: &'static [&'static str],
    /// MiB of incompressible filler in `/filler` (an image big enough to interrupt a copy of).
    pub filler_mib: u64,
    /// Files written into the rootfs: (path relative to `/`, text).
    pub extra: &'static [(&'static str, &'static str)],
}

/// dash, a few coreutils and Debian's python3 with its standard library (no tests, no IDLE):
/// enough for shell and Python payloads (memory hogs, sleepers).
pub const BASE: TestImage = TestImage {
    name: "base",
    binaries: &[
        "/bin/sh",
        "/bin/dash",
        "/bin/sleep",
        "/bin/cat",
        "/bin/head",
        "/bin/tail",
        "/bin/true",
        "/bin/ls",
        "/bin/echo",
        "/usr/bin/python3.11",
    ],
    trees: &["/usr/lib/python3.11"],
    exclude: &[
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "__pycache__",
        "dist-packages",
        "pydoc_data",
    ],
    filler_mib: 0,
    extra: &[],
};

/// [`BASE`] plus 384 MiB of filler: copies of it take long enough to be interrupted.
pub const BULK: TestImage = TestImage { name: "bulk", filler_mib: 384, ..BASE };

/// [`BASE`] plus a vLLM distribution's metadata (no package: only its version is read) of the
/// `vllm/vllm-openai:deepseekv41-flash-0909` image's dev build.
pub const VLLM_DEV: TestImage = TestImage {
    name: "vllm-dev",
    extra: &[(
        "usr/local/lib/python3.11/dist-packages/vllm-0.1.dev20904+g179dd0fa9.dist-info/METADATA",
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.1.dev20904+g179dd0fa9\n",
    )],
    ..BASE
};

/// [`BASE`] plus the metadata of released vLLM 0.34.0.
pub const VLLM_RELEASE: TestImage = TestImage {
    name: "vllm-release",
    extra: &[(
        "usr/local/lib/python3.11/dist-packages/vllm-0.34.0.dist-info/METADATA",
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n",
    )],
    ..BASE
};

impl TestImage {
    fn files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for b in self.binaries {
            out.push(PathBuf::from(b));
            out.extend(libraries(Path::new(b)));
        }
        for t in self.trees {
            walk(Path::new(t), self.exclude, &mut out);
        }
        // Python's extension modules load their own libraries (libssl, libz, libffi, …).
        let so: Vec<PathBuf> = out.iter().filter(|p| p.extension().is_some_and(|e| e == "so")).cloned().collect();
        for s in so {
            out.extend(libraries(&s));
        }
        out.sort();
        out.dedup();
        out
    }

    /// The cached rootfs tarball, built when its inputs changed.
    pub fn tarball(&self) -> PathBuf {
        let files = self.files();
        let mut h = sha2::Sha256::new();
        use sha2::Digest;
        h.update(format!("spark-kit test image v1\0{}\0", self.filler_mib).as_bytes());
        for (path, text) in self.extra {
            h.update(format!("{path}\0{text}\0").as_bytes());
        }
        for f in &files {
            let m = std::fs::metadata(f).unwrap();
            let mtime =
                m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
            h.update(format!("{}\0{}\0{}\0", f.display(), m.len(), mtime.as_nanos()).as_bytes());
        }
        let key: String = h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        let cache =
            std::env::var("SPARK_KIT_CACHE").map_or_else(|_| Path::new(&home).join(".cache/spark-kit"), PathBuf::from);
        let dir = cache.join("test-images");
        let tar = dir.join(format!("{}-{key}.tar", self.name));
        if tar.is_file() {
            return tar;
        }
        std::fs::create_dir_all(&dir).unwrap();
        let root = tempfile::tempdir().unwrap();
        for f in &files {
            let dest = root.path().join(f.strip_prefix("/").unwrap());
            std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
            // Follow links: the image gets the files, whatever the host's link layout.
            std::fs::copy(f, &dest).unwrap();
        }
        for d in ["proc", "sys", "dev", "tmp", "etc"] {
            std::fs::create_dir_all(root.path().join(d)).unwrap();
        }
        std::fs::write(root.path().join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
        std::os::unix::fs::symlink("python3.11", root.path().join("usr/bin/python3")).unwrap();
        for (path, text) in self.extra {
            let dest = root.path().join(path);
            std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
            std::fs::write(dest, text).unwrap();
        }
        if self.filler_mib > 0 {
            // xorshift64: deterministic, incompressible enough for rsync and docker.
            let mut f = std::io::BufWriter::new(std::fs::File::create(root.path().join("filler")).unwrap());
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            let mut block = vec![0u8; 1 << 20];
            for _ in 0..self.filler_mib {
                for c in block.chunks_exact_mut(8) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    c.copy_from_slice(&x.to_le_bytes());
                }
                std::io::Write::write_all(&mut f, &block).unwrap();
            }
        }
        let part = dir.join(format!(".{}-{key}.tar.part", self.name));
        let st = Command::new("tar")
            .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "-C"])
            .arg(root.path())
            .args(["-cf"])
            .arg(&part)
            .arg(".")
            .status()
            .unwrap();
        assert!(st.success(), "tar of the test rootfs failed");
        std::fs::rename(&part, &tar).unwrap();
        tar
    }
}

fn walk(dir: &Path, exclude: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name();
        if exclude.iter().any(|x| name == *x) {
            continue;
        }
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&p, exclude, out),
            Ok(_) if p.is_file() => out.push(p),
            _ => {}
        }
    }
}

/// The shared libraries `bin` loads, per `ldd` (absolute paths, the loader included).
fn libraries(bin: &Path) -> Vec<PathBuf> {
    let Ok(o) = Command::new("ldd").arg(bin).output() else { return Vec::new() };
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .collect()
}
