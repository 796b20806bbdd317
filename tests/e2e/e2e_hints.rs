//! Issue 21 items 3, 4, 7 and 8 end to end on the tiny-cpu kit: every command `up --detach`
//! prints is run as printed (status, logs -f, down, the curl with its API key header); a killed
//! EngineCore is named as what died first; `status`
//! without --kit finds the deployment; the boot phase shows in `status` while booting; Ctrl-C of
//! a foreground `up` exits 130.
//!
//! Needs the engine venv (SPARK_KIT_TEST_E2E, set by tests/run-all.sh); boots vLLM twice, so run
//! it under the e2e lock: `flock /tmp/spark-e2e.lock cargo test --test e2e e2e_hints::`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::up::e2e_enabled;
use common::{free_port, group_members, spark_kit, venv_python};

const KEY_VAR: &str = "SPARK_HINTS_TEST_KEY";
const KEY: &str = "hints-e2e-secret";

/// A shell where `spark-kit` is this build, with the test's cache and key in its environment:
/// the user's shell after `up`.
struct Shell {
    bin: tempfile::TempDir,
    cache: PathBuf,
}

impl Shell {
    fn new(cache: &Path) -> Self {
        let bin = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_spark-kit"), bin.path().join("spark-kit")).unwrap();
        Self { bin, cache: cache.to_path_buf() }
    }

    fn command(&self, line: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c").arg(line);
        for (k, _) in std::env::vars() {
            if k.starts_with("SPARK_KIT_") && !k.starts_with("SPARK_KIT_TEST_") {
                c.env_remove(k);
            }
        }
        let path = format!("{}:{}", self.bin.path().display(), std::env::var("PATH").unwrap_or_default());
        c.env("PATH", path).env("SPARK_KIT_CACHE", &self.cache).env(KEY_VAR, KEY);
        c
    }

    fn run(&self, line: &str) -> Output {
        let o = self.command(line).output().unwrap();
        eprintln!("$ {line}\n  exit {:?}\n{}{}", o.status.code(), text(&o.stdout), text(&o.stderr));
        o
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The command after `label:` in `up`'s banner.
fn hint<'a>(banner: &'a str, label: &str) -> &'a str {
    banner
        .lines()
        .find_map(|l| l.strip_prefix(label).map(str::trim))
        .unwrap_or_else(|| panic!("no `{label}` line in:\n{banner}"))
}

/// Runs `down` for the deployment when the test ends, so a failed assertion does not leave a
/// detached deployment running (after the test's own `down` it finds nothing).
struct DownOnDrop<'a> {
    sh: &'a Shell,
    line: String,
}

impl Drop for DownOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.sh.command(&self.line).output();
    }
}

/// The lines of every engine log in `logs` that say what died, and each log's last 30 lines.
fn what_died_lines(logs: &Path) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(logs).into_iter().flatten().flatten() {
        let Ok(t) = std::fs::read_to_string(e.path()) else { continue };
        out.push_str(&format!("--- {}\n", e.path().display()));
        for l in t.lines().filter(|l| l.contains("child exited")) {
            out.push_str(&format!("{l}\n"));
        }
        let lines: Vec<&str> = t.lines().collect();
        for l in &lines[lines.len().saturating_sub(30)..] {
            out.push_str(&format!("  | {l}\n"));
        }
    }
    out
}

fn status_json(sh: &Shell) -> Option<serde_json::Value> {
    let o = sh.command("spark-kit status --json").output().unwrap();
    o.status.success().then(|| serde_json::from_slice(&o.stdout).unwrap())
}

#[test]
fn printed_hints_work_as_copied() {
    if !e2e_enabled() {
        return;
    }
    let venv = venv_python().parent().unwrap().parent().unwrap().to_path_buf();
    let cache = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let sh = Shell::new(cache.path());
    let port = free_port();
    let up = format!(
        "spark-kit up --detach --kit tiny-cpu --port {port} --set paths.logs={} --set engine.venv={} --set engine.api_keys.env={KEY_VAR}",
        logs.path().display(),
        venv.display()
    );
    let _down = DownOnDrop {
        sh: &sh,
        line: format!("spark-kit down --kit tiny-cpu --set paths.logs={}", logs.path().display()),
    };
    // `up --detach` returns once ready; meanwhile `status` (no --kit) shows the boot phase.
    let mut child = sh.command(&up).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut phases = Vec::new();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(900), "up --detach not done in 900 s");
        if let Some(s) = status_json(&sh) {
            if let Some(p) = s["nodes"][0]["phase"].as_str() {
                if phases.last().map(String::as_str) != Some(p) {
                    phases.push(p.to_string());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let out = child.wait_with_output().unwrap();
    let banner = text(&out.stdout);
    eprintln!("{banner}{}\nphases seen by `status` while booting: {phases:?}", text(&out.stderr));
    assert!(out.status.success(), "up --detach failed");
    assert!(!phases.is_empty(), "`status` never showed a boot phase");
    assert!(phases.iter().any(|p| p.starts_with("loading") || p.contains("API server")), "{phases:?}");

    // Item 4: the curl as printed answers (the key comes from the variable, never printed).
    let curl = hint(&banner, "try:");
    assert!(curl.contains(&format!("Authorization: Bearer ${KEY_VAR}")), "{curl}");
    assert!(!banner.contains(KEY), "the key itself was printed");
    let o = sh.run(curl);
    assert!(o.status.success());
    let answer: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(answer["choices"][0]["message"]["content"].is_string(), "{answer}");
    // …and without the header the same request is refused: the header is what makes it work.
    let bare = curl.replace(&format!(" -H \"Authorization: Bearer ${KEY_VAR}\""), "");
    let o = sh.run(&bare);
    assert!(text(&o.stdout).contains("Unauthorized") || text(&o.stdout).contains("401"), "{}", text(&o.stdout));

    // Item 7: a crash of EngineCore is said as what died first (vLLM itself exits 0 then), in
    // status' reason, and the deployment restarts and answers again.
    let s = status_json(&sh).unwrap();
    let pgid = s["nodes"][0]["engine_pgid"].as_i64().unwrap() as i32;
    let core = common::descendants(pgid)
        .into_iter()
        .find(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.starts_with("VLLM::EngineCor")))
        .expect("no VLLM::EngineCore under the engine");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(core), nix::sys::signal::Signal::SIGKILL).unwrap();
    let want = format!("first to die: its child pid {core} (VLLM::EngineCor) killed by signal 9 (SIGKILL)");
    let t = Instant::now();
    let s = loop {
        let s = status_json(&sh).unwrap_or_default();
        if s["restarts"].as_u64().unwrap_or(0) >= 1 {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "EngineCore's death not seen: {s}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(
        s["reason"].as_str().unwrap_or_default().contains(&want),
        "want `{want}` in the reason: {s}\n{}",
        what_died_lines(logs.path())
    );
    let t = Instant::now();
    while status_json(&sh).unwrap_or_default()["state"] != "ready" {
        assert!(t.elapsed() < Duration::from_secs(600), "not ready again after the restart");
        std::thread::sleep(Duration::from_secs(1));
    }
    let o = sh.run(curl);
    assert!(o.status.success(), "the curl after the restart");

    // Item 3: status as printed, and with no --kit at all.
    let status = hint(&banner, "status:");
    assert_eq!(status, "spark-kit status --kit tiny-cpu");
    let o = sh.run(status);
    assert!(o.status.success());
    assert!(text(&o.stdout).contains("state Ready"), "{}", text(&o.stdout));
    let o = sh.run("spark-kit status");
    assert!(o.status.success());
    assert!(text(&o.stdout).contains("kit tiny-cpu"));

    // logs -f as printed: follows the engine log (of the logs dir the deployment really uses).
    let follow = hint(&banner, "follow:");
    assert_eq!(follow, "spark-kit logs --kit tiny-cpu -f");
    let mut f = sh.command(follow).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut lines = BufReader::new(f.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains(" local/r0 "), "{first}");
    assert!(f.try_wait().unwrap().is_none(), "logs -f exited");
    f.kill().unwrap();
    f.wait().unwrap();

    // down as printed: stops it (also while it boots again); then nothing is running.
    let down = hint(&banner, "stop:");
    assert_eq!(down, "spark-kit down --kit tiny-cpu");
    let o = sh.run(down);
    assert!(o.status.success());
    let o = sh.run("spark-kit status");
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("no spark-kit deployment is running here"));
    let o = sh.run(down);
    assert_eq!(o.status.code(), Some(1));
    assert!(!text(&o.stderr).contains("stopping"), "{}", text(&o.stderr));
}

/// Item 7: Ctrl-C of a foreground `up` stops everything and exits 130; item 8: without a TTY
/// the boot prints a progress line (elapsed time and phase) at least once a minute.
#[test]
fn ctrl_c_of_foreground_up_exits_130() {
    if !e2e_enabled() {
        return;
    }
    let venv = venv_python().parent().unwrap().parent().unwrap().to_path_buf();
    let cache = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let mut cmd = spark_kit();
    cmd.args(["up", "--kit", "tiny-cpu", "--port", &port])
        .args(["--set", &format!("paths.logs={}", logs.path().display())])
        .args(["--set", &format!("engine.venv={}", venv.display())])
        .env("SPARK_KIT_CACHE", cache.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
    }
    let mut seen = Vec::new();
    let t = Instant::now();
    while !seen.iter().any(|l: &String| l.starts_with("Ctrl-C")) {
        assert!(t.elapsed() < Duration::from_secs(900), "not ready: {seen:?}");
        if let Ok(l) = rx.recv_timeout(Duration::from_secs(1)) {
            eprintln!("{l}");
            seen.push(l);
        }
        assert!(child.try_wait().unwrap().is_none(), "up exited: {seen:?}");
    }
    let pgid = common::engine_pgid_under(child.id() as i32).unwrap();
    let started = seen.iter().position(|l| l.contains("engine started")).unwrap();
    let healthy = seen.iter().position(|l| l.contains("/health answered 200")).unwrap();
    let secs: f64 = seen[healthy].split("after ").nth(1).unwrap().trim_end_matches(" s").parse().unwrap();
    let progress: Vec<&String> =
        seen[started..healthy].iter().filter(|l| l.trim_start().starts_with("booting ")).collect();
    eprintln!("boot took {secs:.1} s; progress lines: {progress:?}");
    if secs > 61.0 {
        assert!(!progress.is_empty(), "no progress line in a {secs:.0} s boot: {seen:?}");
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "up after Ctrl-C: {status}");
    assert!(group_members(pgid).is_empty(), "engine group left: {:?}", group_members(pgid));
    // The registry entry is gone with it.
    let run = cache.path().join("run");
    let left: Vec<_> = std::fs::read_dir(&run).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}
