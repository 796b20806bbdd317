//! The memory guard on the real host: floors set relative to the current MemAvailable, a "hog"
//! that grows ~1.5 GiB quickly, an engine stand-in (its own process group, oom_score_adj 1000,
//! one child). `kill-offender` must kill the hog, not the stand-in, and write a receipt;
//! `protect-host` with the stand-in growing must kill the stand-in's whole group. The reaction
//! time from the floor crossing (seen by the grower itself) to the signal is measured and logged.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{group_members, spark_kit};

const MIB: u64 = 1 << 20;
/// The most a grower allocates (it normally stops ~1.2 GiB in, 256 MiB past the floor).
const GROW_CAP: u64 = 3 << 30;

/// The host tests share one machine's MemAvailable: they run one at a time.
static HOST: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A process that grows at `rate` bytes/s in 1 MiB chunks until 256 MiB past the moment
/// MemAvailable first falls to `floor` (at most `total`: other processes on a shared host may free
/// memory meanwhile), and on SIGTERM writes what it saw to `out`.
/// Args: out floor total rate comm. Env: HOG_OOM_ADJ, HOG_CHILD (one `sleep` child), HOG_DELAY,
/// HOG_GO (a file whose existence starts the growth).
const HOG: &str = r#"
import ctypes, json, os, signal, subprocess, sys, time
out, floor, total, rate, comm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
ctypes.CDLL(None).prctl(15, comm.encode()[:15], 0, 0, 0)
if os.environ.get("HOG_OOM_ADJ"):
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(os.environ["HOG_OOM_ADJ"])
child = subprocess.Popen(["sleep", "600"]) if os.environ.get("HOG_CHILD") else None
crossed = None
grown = 0
def avail():
    with open("/proc/meminfo", "rb") as f:
        for l in f:
            if l.startswith(b"MemAvailable:"):
                return int(l.split()[1]) * 1024
def on_term(sig, frm):
    t = time.monotonic()
    c = crossed if crossed is not None else (t if avail() <= floor else None)
    with open(out + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "comm": comm, "signal": sig, "t_signal": t, "t_crossed": c, "grown": grown}, f)
    os.rename(out + ".tmp", out)
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(float(os.environ.get("HOG_DELAY", "0")))
while os.environ.get("HOG_GO") and not os.path.exists(os.environ["HOG_GO"]):
    time.sleep(0.01)
chunks, CH, t0 = [], 1 << 20, time.monotonic()
grown_at_cross = 0
while grown < total:
    if crossed is not None and grown >= grown_at_cross + 256 * CH:
        break
    chunks.append(b"\x01" * CH)
    grown += CH
    if crossed is None and avail() <= floor:
        crossed, grown_at_cross = time.monotonic(), grown
    ahead = grown / rate - (time.monotonic() - t0)
    if ahead > 0:
        time.sleep(ahead)
while True:
    if crossed is None and avail() <= floor:
        crossed = time.monotonic()
    time.sleep(0.002)
"#;

fn mem_available() -> u64 {
    let t = std::fs::read_to_string("/proc/meminfo").unwrap();
    spark_kit::memguard::meminfo::parse(t.as_bytes()).unwrap().mem_available
}

/// Why this host cannot run the test, if it cannot.
fn unfit() -> Option<String> {
    if Command::new("python3").arg("-c").arg("pass").status().map_or(true, |s| !s.success()) {
        return Some("python3 is not installed (the hog is a python3 script)".into());
    }
    let avail = mem_available();
    if avail < 6 << 30 {
        return Some(format!("MemAvailable is only {} MiB; the test needs ≥ 6 GiB to stay safe", avail / MIB));
    }
    None
}

struct Hog {
    child: Child,
}

impl Hog {
    fn start(dir: &Path, name: &str, floor: u64, total: u64, own_group: bool, engine_like: bool, delay: f64) -> Self {
        let mut cmd = Command::new("python3");
        cmd.args(["-c", HOG])
            .arg(dir.join(format!("{name}.json")))
            .args([floor.to_string(), total.to_string(), (1536 * MIB).to_string(), name.to_string()])
            .env("HOG_DELAY", delay.to_string())
            .env("HOG_GO", dir.join(format!("{name}.go")))
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        if engine_like {
            cmd.env("HOG_OOM_ADJ", "1000").env("HOG_CHILD", "1");
        }
        if own_group {
            cmd.process_group(0);
        }
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        Self { child }
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }

    /// Wait for it to exit; false if it still runs after `limit`.
    fn wait(&mut self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.child.try_wait().unwrap().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.pid());
        let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct GuardProc {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl GuardProc {
    fn start(pgid: i32, soft: u64, hard: u64, policy: &str, receipts: &Path, extra: &[String]) -> Self {
        let mut child = spark_kit()
            .args(["guard", "--kit", "tiny-cpu", "--json", "--policy", policy, "--drain", "3"])
            .args(["--pgid", &pgid.to_string(), "--soft", &soft.to_string(), "--hard", &hard.to_string()])
            .arg("--receipts")
            .arg(receipts)
            .args(["--victims-under", &std::process::id().to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let rx = common::stdout_lines(&mut child);
        let first = rx.recv_timeout(Duration::from_secs(30)).expect("guard printed nothing");
        assert!(first.contains("\"event\":\"started\""), "{first}");
        Self { child, lines: rx }
    }

    fn stop(mut self) -> Vec<serde_json::Value> {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "guard exited {status}");
        self.lines.try_iter().map(|l| serde_json::from_str(&l).unwrap()).collect()
    }
}

fn read_json(p: &Path) -> Option<serde_json::Value> {
    std::fs::read_to_string(p).ok().map(|t| serde_json::from_str(&t).unwrap())
}

fn receipt(dir: &Path, decision: &str) -> serde_json::Value {
    let f = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(&format!("-{decision}.json")))
        .unwrap_or_else(|| {
            let all: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .flatten()
                .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
                .collect();
            panic!("no {decision} receipt in {}: {all:#?}", dir.display())
        });
    read_json(&f.path()).unwrap()
}

/// Crossing → signal, as the victim saw it (ms); None if it never saw the floor before the signal.
fn reaction_ms(victim: &serde_json::Value) -> Option<f64> {
    let c = victim["t_crossed"].as_f64()?;
    Some((victim["t_signal"].as_f64().unwrap() - c) * 1000.0)
}

fn wait_members(pgid: i32, n: usize) {
    let until = Instant::now() + Duration::from_secs(10);
    while group_members(pgid).len() < n && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(group_members(pgid).len() >= n, "stand-in group {pgid}: {:?}", group_members(pgid));
}

#[test]
fn kill_offender_kills_the_hog_not_the_engine_stand_in() {
    let _one_at_a_time = HOST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(why) = unfit() {
        eprintln!("skipping: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let receipts = dir.path().join("receipts");
    let standin = Hog::start(dir.path(), "sk-standin", 0, 0, true, true, 0.0);
    wait_members(standin.pid(), 2);
    let avail = mem_available();
    let (soft, hard) = (avail - 600 * MIB, avail - 900 * MIB);
    let guard = GuardProc::start(standin.pid(), soft, hard, "kill-offender", &receipts, &[]);
    let mut hog = Hog::start(dir.path(), "sk-hog", hard, GROW_CAP, false, false, 0.2);
    std::fs::write(dir.path().join("sk-hog.go"), "").unwrap();
    let killed = hog.wait(Duration::from_secs(20));
    let events = guard.stop();
    assert!(killed, "the hog was not killed; guard events: {events:?}");

    let seen = read_json(&dir.path().join("sk-hog.json")).expect("the hog got no SIGTERM");
    assert_eq!(seen["signal"], 15);
    assert!(read_json(&dir.path().join("sk-standin.json")).is_none(), "the engine stand-in was signalled");
    assert_eq!(group_members(standin.pid()).len(), 2, "the stand-in group must be untouched");

    let r = receipt(&receipts, "kill-offender");
    assert_eq!(r["victim"]["pid"], hog.pid());
    assert_eq!(r["victim"]["comm"], "sk-hog");
    assert_eq!(r["signals"][0]["signal"], "SIGTERM");
    assert_eq!(r["signals"][0]["target"], "pid");
    assert_eq!(r["outcome"]["gone"], true);
    assert_eq!(r["engine"]["pgid"], standin.pid());
    assert!(r["at_crossing"]["mem_available"].as_u64().unwrap() <= hard);
    assert!(events.iter().any(|e| e["event"] == "acting" && e["victim"]["pid"] == hog.pid()));
    assert!(events.iter().any(|e| e["event"] == "oom-score-adj" && e["check"]["ok"] == true));
    eprintln!(
        "kill-offender: victim {} (pid {}), reaction from crossing to SIGTERM: {} (guard's own: {:.1} ms); hog saw {seen}",
        seen["comm"],
        seen["pid"],
        reaction_ms(&seen).map_or("before the hog saw the floor".into(), |m| format!("{m:.1} ms")),
        r["reaction_ms"].as_f64().unwrap()
    );
}

#[test]
fn protect_host_kills_the_growing_engine_stand_ins_whole_group() {
    let _one_at_a_time = HOST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(why) = unfit() {
        eprintln!("skipping: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let receipts = dir.path().join("receipts");
    let avail = mem_available();
    let (soft, hard) = (avail - 600 * MIB, avail - 900 * MIB);
    let mut standin = Hog::start(dir.path(), "sk-standin", hard, GROW_CAP, true, true, 0.0);
    let pgid = standin.pid();
    wait_members(pgid, 2);
    // The idle baseline for the restart gate: MemAvailable now, with the stand-in still small.
    let baseline = vec!["--baseline".to_string(), avail.to_string()];
    let guard = GuardProc::start(pgid, soft, hard, "protect-host", &receipts, &baseline);
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(dir.path().join("sk-standin.go"), "").unwrap();
    let killed = standin.wait(Duration::from_secs(20));
    let until = Instant::now() + Duration::from_secs(10);
    while !group_members(pgid).is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Give the restart gate a moment to see the memory come back.
    std::thread::sleep(Duration::from_millis(500));
    let events = guard.stop();
    assert!(killed, "the stand-in was not stopped; guard events: {events:?}");
    assert!(group_members(pgid).is_empty(), "group survivors: {:?}", group_members(pgid));

    let seen = read_json(&dir.path().join("sk-standin.json")).expect("the stand-in got no SIGTERM");
    let r = receipt(&receipts, "kill-engine-group");
    assert_eq!(r["signals"][0]["target"], "pgid");
    assert_eq!(r["signals"][0]["id"], pgid);
    assert_eq!(r["outcome"]["gone"], true);
    assert!(r["engine"]["grown_bytes"].as_u64().unwrap() >= 256 * MIB);
    assert!(r["reason"].as_str().unwrap().contains("the engine grew"));
    // After the engine kill, MemAvailable came back within 2 GiB of the baseline: restart allowed.
    let gate = events.iter().find(|e| e["event"] == "restart-gate").expect("no restart-gate event");
    assert_eq!(gate["gate"]["state"], "open", "{gate}");
    eprintln!(
        "protect-host: engine stand-in group {pgid} stopped, reaction from crossing to SIGTERM: {} (guard's own: {:.1} ms)",
        reaction_ms(&seen).map_or("before the stand-in saw the floor".into(), |m| format!("{m:.1} ms")),
        r["reaction_ms"].as_f64().unwrap()
    );
}

#[test]
fn bad_flags_are_one_line_usage_errors() {
    let cases: [(&[&str], &str); 4] = [
        (&["--soft", "1GiB", "--hard", "2GiB"], "--soft 1073741824 is below --hard 2147483648"),
        (&["--hard", "lots"], "--hard: `lots` is not a byte size"),
        (&["--policy", "kill-all"], "--policy: `kill-all` is not a guard policy"),
        (&["--pgid", "999999999"], "--pgid 999999999: no live process in that process group"),
    ];
    for (args, want) in cases {
        let out = spark_kit().args(["guard", "--kit", "tiny-cpu"]).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.lines().next().unwrap().contains(want), "{args:?}: {err}");
        assert!(err.contains("hint: "), "{err}");
    }
    // A receipt directory that cannot be made is a runtime failure, before anything is watched.
    let out = spark_kit().args(["guard", "--kit", "tiny-cpu", "--receipts", "/proc/self/no/such"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: memory guard: cannot create the receipt directory /proc/self/no/such"), "{err}");
    assert!(err.contains("hint: pass --receipts DIR"), "{err}");
}
