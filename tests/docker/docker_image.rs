//! The engine image across nodes, on real Docker daemons started by the test (two of them: the
//! head's and a "worker"'s, the worker reached through a real sshd on loopback whose sessions
//! talk to the second daemon): preflight names a missing image and a differing image id (both
//! ids), `spark-kit image sync` interrupted by Ctrl-C (SIGINT to its process group) and run
//! again completes, and the worker's image id then equals the head's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{docker, free_port, spark_kit, sshd, Reap};

fn skip(test: &str) -> bool {
    if let Some(why) = docker::unavailable().or_else(|| sshd::skip_reason(&["rsync"])) {
        eprintln!("SKIP {test}: {why}");
        return true;
    }
    false
}

/// A kit file: tiny-cpu-docker with image `image`, and optionally a worker over ssh.
fn kit_file(dir: &Path, image: &str, worker: Option<(u16, &[String])>) -> PathBuf {
    let base = std::fs::read_to_string("launch-kits/tiny-cpu-docker.yaml").unwrap();
    let mut text =
        base.replace("spark-kit/tiny-cpu-engine:local", image).replace("name: tiny-cpu-docker", "name: image-test");
    if let Some((port, opts)) = worker {
        let opts: Vec<String> = opts.iter().map(|o| format!("\"{o}\"")).collect();
        text = text.replace(
            "    transport: local\n",
            &format!(
                "    transport: local\n    fabric:\n      ipv4: 127.0.0.1\n  - name: worker\n    role: worker\n    transport: ssh\n    ssh_host: 127.0.0.1\n    ssh_user: root\n    ssh_port: {port}\n    ssh_options: [{}]\n    fabric:\n      ipv4: 127.0.0.1\n",
                opts.join(", ")
            ),
        );
        text = text.replace("tensor_parallel_size: 1", "tensor_parallel_size: 2");
    }
    let p = dir.join("kit.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

fn preflight(kit: &Path, host: &str) -> (Option<i32>, String) {
    let out = spark_kit().env("DOCKER_HOST", host).args(["preflight", "--kit"]).arg(kit).output().unwrap();
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn preflight_names_a_missing_image_and_the_daemon_problems() {
    if skip("preflight_names_a_missing_image") {
        return;
    }
    let d = docker::daemon().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kit = kit_file(dir.path(), "spark-kit-test/absent:1", None);
    let (code, text) = preflight(&kit, &d.host);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("image `spark-kit-test/absent:1` is not on this node"), "{text}");
    // The kit mounts its venv: the fix is the command that makes the image, carrying the kit file.
    assert!(
        text.contains(&format!("fix: make it here, offline: `spark-kit image build --kit {}`", kit.display())),
        "{text}"
    );
    let (code, text) = preflight(&kit, "unix:///nonexistent/docker.sock");
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("the Docker daemon is not running here (Cannot connect"), "{text}");
    assert!(text.contains("systemctl start docker"), "{text}");
}

#[test]
fn image_id_mismatch_fails_preflight_and_an_interrupted_sync_completes_on_rerun() {
    if skip("image_sync") {
        return;
    }
    let head = docker::daemon().unwrap();
    let worker = docker::worker_daemon().unwrap();
    let image = "spark-kit-test/bulk:1";
    let want = head.import(&docker::BULK, image, None);
    // Same name, same files, a different image id on the worker.
    let other = worker.import(&docker::BULK, image, Some("worker"));
    assert_ne!(want, other);

    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("ssh");
    std::fs::create_dir_all(&keys).unwrap();
    let port = free_port();
    sshd::make_keys(&keys, &[format!("[127.0.0.1]:{port}")]);
    let worker_cache = dir.path().join("worker-cache");
    let head_cache = dir.path().join("head-cache");
    let extra = format!("SetEnv DOCKER_HOST={} SPARK_KIT_CACHE={}\n", worker.host, worker_cache.display());
    let _sshd = Reap(Some(sshd::spawn_with(&keys, &format!("127.0.0.1:{port}"), "w", &[], &extra)));
    let opts = sshd::client_opts(&keys);
    let kit = kit_file(dir.path(), image, Some((port, &opts)));
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t.elapsed() < Duration::from_secs(10), "sshd did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }

    let (code, text) = preflight(&kit, &head.host);
    assert_ne!(code, Some(0), "{text}");
    let line = text.lines().find(|l| l.contains("image-id")).unwrap_or_else(|| panic!("no image-id check:\n{text}"));
    assert!(line.contains("FAIL"), "{line}");
    assert!(text.contains(&format!("local has {want}, worker has {other}")), "{text}");

    // Interrupt the first sync mid-copy, as Ctrl-C would (SIGINT to its process group).
    let sync = || {
        let mut c = spark_kit();
        c.env("DOCKER_HOST", &head.host).env("SPARK_KIT_CACHE", &head_cache).args(["image", "sync", "--kit"]).arg(&kit);
        c
    };
    let mut first = sync().process_group(0).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let stem = want.trim_start_matches("sha256:")[..16].to_string();
    let dst = worker_cache.join("images").join(&stem);
    let t = Instant::now();
    let copying = loop {
        let bytes: u64 = walk_sizes(&dst);
        if bytes > 32 << 20 {
            break true;
        }
        if first.try_wait().unwrap().is_some() || t.elapsed() > Duration::from_secs(120) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(copying, "the copy never started (or finished before it could be interrupted)");
    let pgid = nix::unistd::Pid::from_raw(i32::try_from(first.id()).unwrap());
    nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = first.wait_with_output().unwrap();
    assert!(!out.status.success(), "the interrupted sync must not report success");
    let partial = walk_sizes(&dst);
    assert_eq!(worker.image_id(image).as_deref(), Some(other.as_str()), "nothing loaded after the interruption");
    eprintln!("interrupted with {} MiB on the worker", partial >> 20);

    let t = Instant::now();
    let out = sync().args(["--json"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rerun failed: {err}");
    eprintln!("rerun completed in {:.1} s:\n{err}", t.elapsed().as_secs_f64());
    let done: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(done[1]["node"], "worker");
    assert_eq!(done[1]["action"], "copied");
    assert_eq!(worker.image_id(image).as_deref(), Some(want.as_str()), "worker's id equals the head's");
    assert!(!dst.exists(), "the copied archive is removed after the load");

    // A third run has nothing to do; preflight now passes the image checks.
    let out = sync().output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("worker: present {want}")));
    let (_, text) = preflight(&kit, &head.host);
    let line = text.lines().find(|l| l.contains("image-id")).unwrap();
    assert!(line.contains("pass"), "{line}");
}

fn walk_sizes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => walk_sizes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

/// A long docker call (here `docker import`) against a daemon that answers its first check and then
/// stops (SIGSTOP: it accepts connections and answers none) is stopped by the heartbeat and named;
/// without one the client would wait forever.
#[test]
fn a_long_docker_call_is_stopped_when_its_daemon_stops_answering() {
    use spark_kit::bounded::{self, Ended};
    use spark_kit::runtime::docker::dockerctl::DockerError;
    use spark_kit::runtime::docker::heartbeat::{watched, Heartbeat};
    if let Some(why) = docker::unavailable() {
        eprintln!("SKIP a_long_docker_call_is_stopped_when_its_daemon_stops_answering: {why}");
        return;
    }
    let _one = docker::ONE_STALL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let d = docker::stalled_daemon().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let tar = dir.path().join("rootfs.tar");
    assert!(Command::new("tar").arg("-cf").arg(&tar).arg("-C").arg(dir.path()).arg("f").status().unwrap().success());
    let version = move || {
        let mut c = Command::new("docker");
        c.env("DOCKER_HOST", &d.host).args(["version", "--format", "{{.Server.Version}}"]);
        match bounded::run(&mut c, Duration::from_secs(2)).unwrap() {
            Ended::Exited { status, .. } if status.success() => Ok(()),
            _ => Err(DockerError::NoAnswer { what: "version".into(), secs: 2 }),
        }
    };
    // The daemon answers the check before the call; then it stops, and the call is on its own.
    // On a thread: a watch that never gives up fails the test instead of hanging it.
    let host = d.host.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut stalled = None;
        let mut alive = || {
            let answer = version();
            if stalled.is_none() {
                stalled = Some(d.stall());
            }
            answer
        };
        let mut import = Command::new("docker");
        import.env("DOCKER_HOST", &host).arg("import").arg(&tar).arg("spark-kit-test/stalled:import");
        let t = Instant::now();
        let beat = Heartbeat { every: Duration::from_millis(500), misses: 2 };
        let result = watched(&mut import, "import", None, beat, &mut alive, &mut |_| {});
        let _ = tx.send((result, t.elapsed(), stalled));
    });
    let (result, took, stalled) = rx.recv_timeout(Duration::from_secs(60)).expect("the watched call hung");
    let e = result.unwrap_err();
    assert_eq!(e, DockerError::Unresponsive { what: "import".into(), checks: 2, every_s: 0 });
    // Two checks of up to 2 s each, 0.5 s apart, and the kill.
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert!(e.to_string().contains("stopped answering during `docker import`"), "{e}");
    drop(stalled);
    // Resumed, the daemon answers again: the watch stopped only its own client.
    assert!(version().is_ok());
    eprintln!(
        "docker import against a daemon stopped after its first check: given up after {:.1} s",
        took.as_secs_f64()
    );
}
