//! `model.sync: rsync` for real: a real sshd on loopback (keys made by the test) plays the
//! worker; `spark-kit __cache-capped` wraps rsync on both ends. Shown: the copy equals the head's
//! tree; a copy killed with SIGKILL mid-file leaves no file under its final name and a rerun
//! completes; the page cache the capped copy keeps on the destination file stays near the cap
//! while the same copy without the cap keeps the whole file cached.
//!
//! A cache written by the real `hf download` (shared blob store: symlinked blobs) syncs as real
//! bytes, and a dangling link on the head stops the step naming it.
//!
//! Needs root (sshd), sshd, rsync and fincore (and the Python Xet client's venv for the `hf`
//! cache): runs in CI (`tests/run-all.sh`); otherwise prints why it skips.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::common;
use crate::fake_hub;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spark_kit::kit::schema::{Node, Transport};
use spark_kit::weights::{listing, rsync};

const MIB: u64 = 1 << 20;

fn skip_reason() -> Option<String> {
    if std::env::var_os("SPARK_KIT_TEST_E2E").is_none() {
        return Some("SPARK_KIT_TEST_E2E is not set (run `bash tests/run-all.sh`)".into());
    }
    common::sshd::skip_reason(&["rsync", "fincore"])
}

struct Sshd {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
}

impl Sshd {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = common::free_port();
        common::sshd::make_keys(dir.path(), &[format!("[127.0.0.1]:{port}")]);
        let child = common::sshd::spawn(dir.path(), &format!("127.0.0.1:{port}"), "loopback", &[]);
        let s = Self { dir, port, child };
        let t = Instant::now();
        loop {
            let ok = Command::new("ssh")
                .args(s.node().ssh_options.iter())
                .args(["-o", "BatchMode=yes", "-p", &port.to_string(), "root@127.0.0.1", "true"])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return s;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "sshd did not come up");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn node(&self) -> Node {
        Node {
            name: "node-b".into(),
            transport: Transport::Ssh,
            ssh_host: Some("127.0.0.1".into()),
            ssh_user: Some("root".into()),
            ssh_port: self.port,
            ssh_options: common::sshd::client_opts(self.dir.path()),
            ..Node::default()
        }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A file of `size` bytes of incompressible data (drop its page cache after writing).
fn write_file(path: &Path, size: u64, seed: u8) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = std::fs::File::create(path).unwrap();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ u64::from(seed);
    let mut buf = vec![0u8; MIB as usize];
    for _ in 0..size / MIB {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        f.write_all(&buf).unwrap();
    }
    f.sync_all().unwrap();
    drop_cache(path);
}

fn drop_cache(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        let _ = nix::fcntl::posix_fadvise(&f, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED);
    }
}

/// Bytes of `path` in the page cache (`fincore`), 0 when it does not exist.
fn resident(path: &Path) -> u64 {
    let out = Command::new("fincore").args(["--bytes", "--noheadings", "--raw", "--output", "RES"]).arg(path).output();
    out.ok().and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok()).unwrap_or(0)
}

/// rsync's temporary file while it receives `name` into `dir` (`.name.XXXXXX`), if any.
fn receiving(dir: &Path, name: &str) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!(".{name}."))))
}

/// Run one sync of `src` to `dst`; while it runs, record the most page cache seen on the file
/// being received (the temporary file, then the final one). `capped: false` runs plain rsync.
fn sync(node: &Node, src: &Path, dst: &Path, cap: Option<u64>, watch: (&str, &str)) -> (Result<(), String>, u64) {
    let exe = env!("CARGO_BIN_EXE_spark-kit");
    let mut argv = rsync::argv(node, src, &dst.display().to_string(), exe, exe, cap.unwrap_or(1 << 40));
    if cap.is_none() {
        // The same rsync without the wrapper on either end.
        argv.drain(..5);
        let i = argv.iter().position(|a| a == "--rsync-path").unwrap();
        argv[i + 1] = "rsync".into();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let max = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (stop, max) = (Arc::clone(&stop), Arc::clone(&max));
        let (dir, name) = (dst.join(watch.0), watch.1.to_string());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let mut r = resident(&dir.join(&name));
                if let Some(tmp) = receiving(&dir, &name) {
                    r = r.max(resident(&tmp));
                }
                max.fetch_max(r, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let result = rsync::run(node, &argv, &|_| {}).map_err(|e| e.to_string());
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    (result, max.load(Ordering::SeqCst))
}

#[test]
fn rsync_copies_resumes_and_caps_the_page_cache() {
    if let Some(why) = skip_reason() {
        eprintln!("skipping: {why}");
        return;
    }
    let sshd = Sshd::start();
    let node = sshd.node();
    // On the real disk (not tmpfs: fadvise and fincore must see a page cache).
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = work.path().join("head/models--o--tiny");
    write_file(&src.join("blobs/big"), 512 * MIB, 1);
    write_file(&src.join("blobs/small"), 3 * MIB, 2);
    std::fs::create_dir_all(src.join("snapshots/abc")).unwrap();
    std::os::unix::fs::symlink("../../blobs/big", src.join("snapshots/abc/model.safetensors")).unwrap();
    std::fs::write(src.join("snapshots/abc/config.json"), "{}").unwrap();
    let head = listing::list(&src).unwrap();

    // 1. Killed mid-file: nothing under a final name with the wrong size; the rerun completes.
    let dst = work.path().join("node/models--o--tiny");
    let exe = env!("CARGO_BIN_EXE_spark-kit");
    let argv = rsync::argv(&node, &src, &dst.display().to_string(), exe, exe, 64 * MIB);
    let mut child =
        Command::new(&argv[0]).args(&argv[1..]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let t = Instant::now();
    while receiving(&dst.join("blobs"), "big").and_then(|p| std::fs::metadata(p).ok()).map_or(0, |m| m.len()) < 64 * MIB
    {
        assert!(t.elapsed() < Duration::from_secs(60), "the copy did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SIGKILL the local wrapper, its rsync and ssh (the remote receiver then loses its peer).
    for pid in common::descendants(child.id() as i32) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
    std::thread::sleep(Duration::from_millis(500));
    let after_kill = listing::list(&dst).unwrap_or_default();
    for (p, size) in &after_kill {
        let want = head.iter().find(|(h, _)| h == p).map(|(_, s)| *s);
        assert_eq!(Some(*size), want, "{p} is under its final name with {size} bytes after the kill");
    }
    assert!(!after_kill.iter().any(|(p, _)| p == "blobs/big"), "the killed file appeared under its final name");
    let (r, _) = sync(&node, &src, &dst, Some(64 * MIB), ("blobs", "big"));
    r.unwrap();
    assert_eq!(listing::list(&dst).unwrap(), head, "the resumed copy differs from the head's tree");
    let same = Command::new("cmp").arg(src.join("blobs/big")).arg(dst.join("blobs/big")).status().unwrap();
    assert!(same.success(), "contents differ");
    assert!(std::fs::read_link(dst.join("snapshots/abc/model.safetensors")).is_ok(), "symlink not kept");

    // 2. Page cache: the same 512 MiB copy with a 64 MiB cap and without one.
    let mut report = Vec::new();
    for cap in [Some(64 * MIB), None] {
        let dst = work.path().join(format!("node-{}/m", cap.is_some()));
        drop_cache(&src.join("blobs/big"));
        let (r, max) = sync(&node, &src, &dst, cap, ("blobs", "big"));
        r.unwrap();
        assert_eq!(listing::list(&dst).unwrap(), head);
        report.push((cap, max));
    }
    eprintln!(
        "page cache of the received 512 MiB file, most seen: capped at 64 MiB {} MiB, uncapped {} MiB",
        report[0].1 / MIB,
        report[1].1 / MIB
    );
    assert!(report[1].1 >= 256 * MIB, "the uncapped copy did not fill the cache ({report:?}): no contrast here");
    assert!(report[0].1 <= 192 * MIB, "the capped copy kept {} MiB cached (cap 64 MiB)", report[0].1 / MIB);
}

/// The supervisor's own bring-up (`supervisor::run`, the code `up` runs) through its agent gate
/// and its weights gate only: a real node agent on the sshd node, spawned over ssh as `up` does.
struct Bringup {
    /// The head's home: trees under it are sent home-relative (the node reads its own home).
    home: PathBuf,
}

struct Lines(std::sync::Mutex<Vec<String>>);

impl spark_kit::supervisor::ClusterReporter for Lines {
    fn line(&self, text: &str) {
        self.0.lock().unwrap().push(text.to_string());
    }
}

impl Bringup {
    fn start(_node: &Node, home: &Path) -> Self {
        Self { home: home.to_path_buf() }
    }

    /// The weights gate for `root` under `kit`: its result and the lines it printed.
    fn weights(
        &mut self,
        kit: &spark_kit::kit::schema::Kit,
        root: &Path,
    ) -> (Result<(), spark_kit::supervisor::ClusterError>, Vec<String>) {
        use spark_kit::supervisor::{self, state::Policy, Gates, Handles};
        let gates = Gates {
            exe: PathBuf::from(env!("CARGO_BIN_EXE_spark-kit")),
            preflight: None,
            weight_trees: vec![listing::WeightTree { what: "model", path: root.to_path_buf() }],
            home: self.home.clone(),
            replace: false,
            limits: supervisor::GateLimits::default(),
            engines: false,
        };
        let lines = Lines(std::sync::Mutex::new(Vec::new()));
        let r = supervisor::run(kit, &self.home, Policy::default(), &lines, Handles::new(kit), &gates);
        (r.map(|code| assert_eq!(code, 0)), lines.0.into_inner().unwrap())
    }
}

/// A two-node kit (this head, the sshd node) syncing with `sync`, page cache capped at 64 MiB.
fn two_node_kit(node: Node, sync: spark_kit::kit::schema::WeightSync) -> spark_kit::kit::schema::Kit {
    use spark_kit::kit::schema::{Kit, Role};
    let head = Node { name: "node-a".into(), role: Role::Head, ..Node::default() };
    let mut kit = Kit { nodes: vec![head, node], ..Kit::default() };
    kit.model.sync_page_cache = spark_kit::kit::bytes::ByteSize::mib(64);
    kit.model.sync = sync;
    kit
}

/// The node's copy of a tree under the head's home (root's home over ssh), removed on drop.
struct NodeCopy(PathBuf);

impl NodeCopy {
    fn of(unique: &str) -> Self {
        let node_home = PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()));
        let c = Self(node_home.join(unique));
        let _ = std::fs::remove_dir_all(&c.0);
        c
    }
}

impl Drop for NodeCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The bring-up step itself, through a real node agent over ssh: `shared` finds the node's copy
/// missing and stops naming the files; `rsync` copies, then the same check passes.
#[test]
fn bringup_checks_weights_through_the_agent_and_rsyncs_them() {
    use spark_kit::kit::schema::WeightSync;

    if let Some(why) = skip_reason() {
        eprintln!("skipping: {why}");
        return;
    }
    let sshd = Sshd::start();
    let home = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // Under the head's home, so the node reads it under its own home (root's, over ssh).
    let unique = format!("sk-weights-test-{}", std::process::id());
    let root = home.path().join(&unique).join("models--o--w");
    write_file(&root.join("blobs/a"), 2 * MIB, 3);
    write_file(&root.join("blobs/b"), MIB, 4);
    let node_copy = NodeCopy::of(&unique);
    let mut b = Bringup::start(&sshd.node(), home.path());

    let (r, _) = b.weights(&two_node_kit(sshd.node(), WeightSync::Shared), &root);
    let err = r.unwrap_err();
    let e = err.to_string();
    assert!(e.starts_with(&format!("node-b: the weights under ~/{unique}/models--o--w differ from the head's: 2 file(s) differ: blobs/a missing; blobs/b missing")), "{e}");
    // The fix is the error's hint (`main` prints it on its own `hint:` line).
    assert!(err.hint().is_some_and(|h| h.starts_with("mount the same weights")), "{err:?}");

    let kit = two_node_kit(sshd.node(), WeightSync::Rsync);
    let (r, lines) = b.weights(&kit, &root);
    r.unwrap_or_else(|e| panic!("{e}\n{lines:#?}"));
    assert!(lines.iter().any(|l| l.contains("synced blobs/a")), "{lines:#?}");
    assert!(lines.iter().any(|l| l.starts_with("==> weights (model): 2 file(s)")), "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("all 2 weight file(s) present")), "{lines:#?}");
    assert_eq!(listing::list(&node_copy.0.join("models--o--w")).unwrap(), listing::list(&root).unwrap());
    // A second run copies nothing (only changed files).
    let (r, lines) = b.weights(&kit, &root);
    r.unwrap();
    assert!(!lines.iter().any(|l| l.contains("synced blobs/")), "{lines:#?}");
}

/// A cache written by the real `hf download` (huggingface_hub 2.4.0 with hf_xet, from the test
/// Hub's CAS) with its shared blob store: `models--*/blobs/<sha256>` are links to
/// `../../blobs/<2hex>/<xet hash>`, outside the repo directory `up` ships. The sync materialises
/// them: the node gets the bytes as files and its presence check passes. (Copied as links they
/// would dangle on the node and the check would name every LFS file missing.) A dangling link
/// on the head stops the step naming it before anything is copied.
#[test]
fn a_cache_written_by_hf_with_shared_blobs_ships_real_bytes_and_a_dangling_link_stops_first() {
    use fake_hub::harness::{model_files, MODEL};
    use spark_kit::kit::schema::WeightSync;

    if let Some(why) = skip_reason() {
        eprintln!("skipping: {why}");
        return;
    }
    let Some(py) = fake_hub::python::xet_python() else { return };
    let s = fake_hub::Setup::xet();
    let home = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let unique = format!("sk-hf-sync-test-{}", std::process::id());
    let cache = home.path().join(&unique);
    let out = fake_hub::python::snapshot(&py, &s, &cache, false, &[MODEL]);
    let snap = PathBuf::from(out.lines().last().unwrap().trim());
    let repo = format!("models--{}", MODEL.replace('/', "--"));
    let root = cache.join(&repo);
    let lfs: Vec<_> = model_files().into_iter().filter(|f| f.lfs).collect();
    for f in &lfs {
        let t = std::fs::read_link(root.join("blobs").join(&f.sha256)).unwrap();
        assert!(t.starts_with("../../blobs/"), "{}: {}", f.path, t.display());
    }

    let sshd = Sshd::start();
    let node_copy = NodeCopy::of(&unique);
    let mut b = Bringup::start(&sshd.node(), home.path());
    let kit = two_node_kit(sshd.node(), WeightSync::Rsync);
    let (r, lines) = b.weights(&kit, &root);
    r.unwrap_or_else(|e| panic!("{e}\n{lines:#?}"));
    let n = listing::list(&root).unwrap().len();
    assert!(n > 2 * lfs.len(), "{n} files");
    assert!(lines.iter().any(|l| l.contains(&format!("all {n} weight file(s) present"))), "{lines:#?}");
    // Real bytes on the node: each blob a file (not a link), each snapshot path the Hub's bytes.
    let node = node_copy.0.join(&repo);
    let rel = snap.strip_prefix(&root).unwrap();
    for f in model_files() {
        assert!(std::fs::read(node.join(rel).join(&f.path)).unwrap() == f.content_bytes(), "{} differs", f.path);
    }
    for f in &lfs {
        let m = std::fs::symlink_metadata(node.join("blobs").join(&f.sha256)).unwrap();
        assert!(m.is_file(), "{}: the node's blob is not a file", f.path);
    }

    // The shared store loses a payload: the head's link dangles; nothing is copied.
    drop(node_copy);
    let link = root.join("blobs").join(&lfs[0].sha256);
    std::fs::remove_file(link.parent().unwrap().join(std::fs::read_link(&link).unwrap())).unwrap();
    let node_copy = NodeCopy::of(&unique);
    let (r, lines) = b.weights(&kit, &root);
    let err = r.unwrap_err();
    // Named: the link whose target is gone (reached directly or through a snapshot link).
    let e = err.to_string();
    assert!(e.starts_with("the head's weights: ") && e.contains(&link.display().to_string()), "{e}");
    assert!(e.contains(" to ../../blobs/") && e.ends_with(", which does not exist; nothing was copied"), "{e}");
    assert!(err.is_usage(), "{err:?}");
    assert!(err.hint().is_some_and(|h| h.starts_with("run `spark-kit download`")), "{err:?}");
    assert!(!lines.iter().any(|l| l.contains("rsync")), "{lines:#?}");
    assert!(!node_copy.0.exists(), "something was copied to {}", node_copy.0.display());
}

/// `spark-kit up` itself on a two-node kit (this head, the sshd node as worker) whose local
/// model directory holds a dangling link: it stops at the weight step, before any copy or
/// engine, with exit 2 naming the link and the fix.
#[test]
fn up_refuses_a_dangling_link_in_the_head_weights_with_exit_2() {
    if let Some(why) = skip_reason() {
        eprintln!("skipping: {why}");
        return;
    }
    let sshd = Sshd::start();
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let model = work.path().join("model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("config.json"), "{}").unwrap();
    std::os::unix::fs::symlink("../store/gone.safetensors", model.join("model.safetensors")).unwrap();
    let opts = sshd.node().ssh_options.join(", ");
    let set = |kv: String| ["--set".to_string(), kv];
    let args: Vec<String> = [
        "nodes.1.ssh_host=127.0.0.1".into(),
        format!("nodes.1.ssh_port={}", sshd.port),
        format!("nodes.1.ssh_options=[{opts}]"),
        "model.source=local".into(),
        format!("model.path={}", model.display()),
        "model.sync=rsync".into(),
        format!("engine.port={}", common::free_port()),
        format!("paths.logs={}", work.path().join("logs").display()),
    ]
    .into_iter()
    .flat_map(set)
    .collect();
    let out =
        common::spark_kit().args(["up", "--kit", "tiny-cpu-2node", "--skip-preflight"]).args(&args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let link = model.join("model.safetensors");
    assert!(
        err.contains(&format!(
            "error: the head's weights: {} is a symlink to ../store/gone.safetensors, which does not exist; nothing was copied",
            link.display()
        )),
        "{err}"
    );
    assert!(err.contains("hint: point that link at an existing file or remove it (under model.path)"), "{err}");
}
