//! The memory guard against a containerised engine, on a real Docker daemon started by the test
//! (tests/common/docker.rs): a "hog" grows ~1.3 GiB inside a container run like the engine
//! (`--init`, `--oom-score-adj 1000`, host network); `spark-kit guard --container` must attribute
//! the growth to the container through its cgroup, stop that container with `docker kill`, write
//! a receipt naming it, and leave the host's processes (an idle stand-in here) alone; with the
//! daemon stuck (SIGSTOP), kill the container's processes by pid itself.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{docker, spark_kit};

const MIB: u64 = 1 << 20;

fn mem_available() -> u64 {
    let t = std::fs::read_to_string("/proc/meminfo").unwrap();
    spark_kit::memguard::meminfo::parse(t.as_bytes()).unwrap().mem_available
}

/// A child killed and reaped when the test ends, failed or not (a failing test leaves no guard or
/// stand-in behind holding the harness's output open).
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The two tests that grow a hog run one at a time: each guard would see the other's growth.
static ONE_HOG: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn guard_stops_the_container_that_grows_and_leaves_the_host_alone() {
    if let Some(why) = docker::unavailable() {
        eprintln!("SKIP guard_stops_the_container_that_grows: {why}");
        return;
    }
    hog_is_stopped(docker::daemon().unwrap(), false);
}

/// With dockerd itself stopped (SIGSTOP: it accepts and never answers, while containerd and the
/// container run on), `docker kill` cannot deliver: the guard kills the container's processes by
/// pid after the drain, records the `docker kill` that never answered, and keeps running.
#[test]
fn guard_kills_the_containers_processes_itself_when_the_daemon_is_stuck() {
    if let Some(why) = docker::unavailable() {
        eprintln!("SKIP guard_kills_the_containers_processes_itself: {why}");
        return;
    }
    let _stall = docker::ONE_STALL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    hog_is_stopped(docker::stalled_daemon().unwrap(), true);
}

fn hog_is_stopped(d: &docker::Daemon, stall: bool) {
    let _one = ONE_HOG.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let avail = mem_available();
    if avail < 6 << 30 {
        eprintln!("SKIP the memory guard's hog test: MemAvailable {} MiB < 6 GiB", avail / MIB);
        return;
    }
    let image = "spark-kit-test/base:1";
    d.import(&docker::BASE, image, None);
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    std::fs::create_dir_all(&go).unwrap();
    let name = format!("hog-{}", std::process::id());
    let floor_soft = mem_available() - (1 << 30);
    let floor_hard = floor_soft - 200 * MIB;
    let t = Instant::now();
    let id = d.ok(&[
        "run",
        "-d",
        "--init",
        "--name",
        &name,
        "--network=host",
        "--oom-score-adj=1000",
        &format!("--volume={}:/go:ro", go.display()),
        image,
        "python3",
        "-c",
        docker::HOG,
        &floor_hard.to_string(),
        &(3u64 << 30).to_string(),
        "/go/go",
    ]);
    eprintln!("container started in {:.2} s (vfs)", t.elapsed().as_secs_f64());
    // A host process that must survive: idle, outside the container.
    let mut host = Reaped(Command::new("sleep").arg("600").spawn().unwrap());
    let receipts = dir.path().join("receipts");
    let mut guard = Reaped(
        spark_kit()
            .env("DOCKER_HOST", &d.host)
            .args(["guard", "--kit", "tiny-cpu", "--json", "--policy", "protect-host", "--drain", "3"])
            .args(["--container", &name, "--soft", &floor_soft.to_string(), "--hard", &floor_hard.to_string()])
            .arg("--receipts")
            .arg(&receipts)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    let out = guard.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(serde_json::from_str(&l).unwrap()).is_err() {
                break;
            }
        }
    });
    let wait_for = |what: &str, limit: Duration| -> serde_json::Value {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let ev = rx.recv_timeout(left).unwrap_or_else(|_| panic!("no {what} event within {limit:?}"));
            if ev["event"] == what {
                return ev;
            }
        }
    };
    let started = wait_for("started", Duration::from_secs(30));
    assert_eq!(started["policy"], "protect-host");
    let oom = wait_for("oom-score-adj", Duration::from_secs(10));
    assert_eq!(oom["check"]["ok"], true, "the container's processes have oom_score_adj 1000: {oom}");
    let stalled = stall.then(|| d.stall());
    std::fs::write(go.join("go"), b"").unwrap();
    let acting = wait_for("acting", Duration::from_secs(60));
    assert_eq!(acting["decision"], "kill-engine-group", "{acting}");
    assert_eq!(acting["engine"]["container"], id.as_str(), "{acting}");
    assert!(acting["engine"]["grown_bytes"].as_u64().unwrap() > 512 * MIB, "cgroup growth attributed: {acting}");
    let acted = wait_for("acted", Duration::from_secs(30));
    assert_eq!(acted["gone"], true, "{acted}");
    drop(stalled);
    // A daemon just resumed may not have taken in the container's exit yet.
    let until = Instant::now() + Duration::from_secs(20);
    while d.ok(&["container", "inspect", "--format", "{{.State.Running}}", &name]) != "false" {
        assert!(Instant::now() < until, "the daemon still lists {name} as running");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(host.0.try_wait().unwrap().is_none(), "the host stand-in was left alone");
    let path = acted["receipt"].as_str().unwrap();
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let signals = r["signals"].as_array().unwrap();
    assert_eq!(signals[0]["target"], "container", "{r}");
    assert_eq!(signals[0]["container"], id.as_str());
    if stall {
        // SIGTERM through the stuck daemon never arrived; after the 3 s drain the processes were
        // killed by pid (none refused: root), and the client that never answered is named.
        assert_eq!(signals[0]["signal"], "SIGTERM", "{r}");
        let never = "docker kill: the Docker daemon had not answered by the end of the action";
        assert_eq!(signals[0]["error"], never, "{r}");
        let by_pid = signals.iter().find(|s| s["target"] == "container-pids").unwrap_or_else(|| panic!("{r}"));
        assert_eq!((&by_pid["signal"], &by_pid["error"]), (&"SIGKILL".into(), &serde_json::Value::Null), "{r}");
        assert!(r["outcome"]["ms"].as_f64().unwrap() >= 3000.0, "gone only after the drain: {r}");
    } else {
        assert_eq!(signals[0]["error"], serde_json::Value::Null, "{r}");
    }
    eprintln!("stalled daemon {stall}: reaction {} ms, victim gone after {} ms", r["reaction_ms"], r["outcome"]["ms"]);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(guard.0.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(guard.0.wait().unwrap().success());
    host.0.kill().unwrap();
    let _ = host.0.wait();
    d.ok(&["rm", "-f", &name]);
}

#[test]
fn guard_refuses_a_container_that_is_not_running() {
    if let Some(why) = docker::unavailable() {
        eprintln!("SKIP guard_refuses_a_container_that_is_not_running: {why}");
        return;
    }
    let d = docker::daemon().unwrap();
    let out = spark_kit()
        .env("DOCKER_HOST", &d.host)
        .args(["guard", "--kit", "tiny-cpu", "--container", "no-such-container"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--container no-such-container: no running container"), "{err}");
    // No daemon at all: one line naming the problem and the fix.
    let out = spark_kit()
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .args(["guard", "--kit", "tiny-cpu", "--container", "x"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("Docker daemon is not running"), "{err}");
    assert!(err.contains("systemctl start docker"), "{err}");
}
