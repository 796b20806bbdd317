//! `supervisor::run` in process, against scripted node agents (tests/fixtures/fake_agent.py)
//! pushed and started over the real transports as spark-kit is (the head local, the worker
//! behind an `exec` prefix with a home of its own), no engine: a crash, a hang and a stop at
//! every bring-up gate, the weights' rsync (real rsync through the worker's transport) stopped
//! mid-copy. Each run must end as it should, a stop within 2 s, and leave no process behind.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::state::{Policy, State};
use super::{run, ClusterReporter, GateLimits, Gates, Handles};
use crate::kit::schema::{Kit, Node, Role, Transport, WeightSync};
use crate::node::preflight::PreflightInput;
use crate::weights::listing::{self, WeightTree};

const MIB: usize = 1 << 20;

struct Rig {
    dir: tempfile::TempDir,
    exe: PathBuf,
    kit: Kit,
    head_home: PathBuf,
    tree: PathBuf,
}

/// Two nodes: the head on this machine, the worker `w` behind an exec prefix that gives it its
/// own HOME; `scenario` is the fake agent's script (JSON); the head holds a 2-file weight tree.
fn rig(scenario: &str, sync: WeightSync, file_mib: usize) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fake_agent.py")).unwrap();
    let exe = dir.path().join("fake-agent");
    std::fs::write(&exe, text.replace("SCENARIO = {}", &format!("SCENARIO = json.loads('{scenario}')"))).unwrap();
    let worker_home = dir.path().join("home-w");
    std::fs::create_dir_all(&worker_home).unwrap();
    let prefix = dir.path().join("node-w.sh");
    std::fs::write(&prefix, format!("#!/bin/sh\nexport HOME='{}'\nexec \"$@\"\n", worker_home.display())).unwrap();
    for f in [&exe, &prefix] {
        std::process::Command::new("chmod").arg("755").arg(f).status().unwrap();
    }
    let head_home = dir.path().join("home-head");
    let tree = head_home.join("hub/models--o--w");
    for (name, seed) in [("blobs/a", 1u8), ("blobs/b", 2)] {
        let p = tree.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let data: Vec<u8> = (0..file_mib * MIB).map(|k| (k as u8).wrapping_mul(31).wrapping_add(seed)).collect();
        std::fs::write(p, data).unwrap();
    }
    let head = Node { name: "h".into(), role: Role::Head, ..Node::default() };
    let worker = Node {
        name: "w".into(),
        role: Role::Worker,
        transport: Transport::Exec,
        exec_prefix: vec![prefix.display().to_string()],
        ..Node::default()
    };
    let mut kit = Kit { name: "fake".into(), nodes: vec![head, worker], tensor_parallel_size: 2, ..Kit::default() };
    kit.model.sync = sync;
    kit.engine.ready_timeout_s = 2;
    kit.engine.shutdown_timeout_s = 0;
    Rig { dir, exe, kit, head_home, tree }
}

impl Rig {
    fn gates(&self, preflight: bool, replace: bool) -> Gates {
        // Short enough for a test, long enough for a loaded machine to start python.
        let (hello, short) = (Duration::from_secs(10), Duration::from_secs(4));
        Gates {
            exe: self.exe.clone(),
            preflight: preflight.then(PreflightInput::default),
            weight_trees: vec![WeightTree { what: "model", path: self.tree.clone() }],
            home: self.head_home.clone(),
            replace,
            limits: GateLimits { hello, clean: short, facts: short, files: short },
            engines: true,
        }
    }

    /// Processes still running that this rig started (their command line names its directory).
    fn leftovers(&self) -> Vec<String> {
        let mark = self.dir.path().display().to_string();
        let me = std::process::id().to_string();
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let pid = e.file_name().to_string_lossy().into_owned();
            if pid == me || !pid.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            let zombie = std::fs::read_to_string(e.path().join("stat")).is_ok_and(|s| s.contains(") Z "));
            if cmd.contains(&mark) && !zombie {
                out.push(format!("{pid}: {cmd}"));
            }
        }
        out
    }

    /// Nothing of the rig runs by `by` (polled until then).
    fn assert_clean_by(&self, by: Instant) {
        loop {
            let left = self.leftovers();
            if left.is_empty() {
                return;
            }
            assert!(Instant::now() < by, "left behind: {left:#?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// When the test asks for the stop (Ctrl-C): once a line containing the text is printed (then
/// 300 ms later, the gate under way), or after a time.
#[derive(Clone, Copy)]
enum Stop {
    Never,
    OnLine(&'static str),
    After(Duration),
}

struct Lines {
    lines: Mutex<Vec<String>>,
    stop: Arc<AtomicBool>,
    trigger: Stop,
    stopped_at: Arc<Mutex<Option<Instant>>>,
}

impl Lines {
    fn stop_later(&self, wait: Duration) {
        let (stop, at) = (Arc::clone(&self.stop), Arc::clone(&self.stopped_at));
        std::thread::spawn(move || {
            std::thread::sleep(wait);
            *at.lock().unwrap() = Some(Instant::now());
            stop.store(true, Ordering::SeqCst);
        });
    }
}

impl ClusterReporter for Lines {
    fn line(&self, text: &str) {
        let mut lines = self.lines.lock().unwrap();
        if let Stop::OnLine(t) = self.trigger {
            if text.contains(t) && !lines.iter().any(|l| l.contains(t)) {
                self.stop_later(Duration::from_millis(300));
            }
        }
        lines.push(text.to_string());
    }
}

struct Outcome {
    result: Result<i32, String>,
    lines: Vec<String>,
    state: State,
    /// From the stop request to `run`'s return.
    stop_took: Option<Duration>,
    ended: Instant,
}

fn run_rig(r: &Rig, gates: &Gates, trigger: Stop) -> Outcome {
    let h = Handles::new(&r.kit);
    let rep = Lines {
        lines: Mutex::new(Vec::new()),
        stop: Arc::clone(&h.stop),
        trigger,
        stopped_at: Arc::new(Mutex::new(None)),
    };
    if let Stop::After(d) = trigger {
        rep.stop_later(d);
    }
    let logs = r.dir.path().join("logs");
    let result = run(&r.kit, &logs, Policy::default(), &rep, h.clone(), gates).map_err(|e| e.to_string());
    let ended = Instant::now();
    let stop_took = rep.stopped_at.lock().unwrap().map(|t| ended.duration_since(t));
    let state = h.snapshot.lock().unwrap().state;
    Outcome { result, lines: rep.lines.into_inner().unwrap(), state, stop_took, ended }
}

fn scenario(what: &str, gate: &str) -> String {
    format!(r#"{{"{what}": "{gate}"}}"#)
}

#[test]
fn a_healthy_bring_up_copies_the_weights_serves_and_stops_on_request() {
    let r = rig("{}", WeightSync::Rsync, 1);
    let o = run_rig(&r, &r.gates(false, true), Stop::OnLine("/health answered 200"));
    assert_eq!(o.result, Ok(0), "{:#?}", o.lines);
    assert_eq!(o.state, State::Stopped);
    let copy = r.dir.path().join("home-w/hub/models--o--w");
    assert_eq!(listing::list(&copy).unwrap(), listing::list(&r.tree).unwrap(), "{:#?}", o.lines);
    for want in ["removed nothing", "synced blobs/a", "all 2 weight file(s) present", "==> node w: starting its engine"]
    {
        assert!(o.lines.iter().any(|l| l.contains(want)), "{want}: {:#?}", o.lines);
    }
    assert!(o.stop_took.unwrap() < Duration::from_secs(2), "{:?}", o.stop_took);
    r.assert_clean_by(o.ended + Duration::from_secs(2));
}

/// Ctrl-C while the weights' rsync runs: the copy stops at once (today's supervisor waited for
/// it to finish), no rsync or agent is left, no half-copied file sits under its final name.
#[test]
fn a_stop_during_the_rsync_ends_it_within_2_s_and_leaves_no_half_file() {
    let r = rig(r#"{"slow_rsync": true}"#, WeightSync::Rsync, 4);
    let o = run_rig(&r, &r.gates(false, false), Stop::OnLine("rsync (only changed files"));
    assert_eq!(o.result, Ok(0), "{:#?}", o.lines);
    assert_eq!(o.state, State::Stopped);
    let took = o.stop_took.expect("the stop was asked for");
    assert!(took < Duration::from_secs(2), "stopped after {took:?}: {:#?}", o.lines);
    r.assert_clean_by(o.ended + Duration::from_secs(2) - took);
    let copy = r.dir.path().join("home-w/hub/models--o--w");
    let want = listing::list(&r.tree).unwrap();
    for (name, size) in listing::list(&copy).unwrap_or_default() {
        if name.starts_with(".rsync-partial/") {
            continue;
        }
        assert!(want.contains(&(name.clone(), size)), "{name} ({size} bytes) is not the head's file: {want:?}");
    }
    assert!(!o.lines.iter().any(|l| l.contains("rsync done")), "the copy was not cut: {:#?}", o.lines);
}

/// Every gate: the worker's agent crashes there, hangs there, or the user stops while it hangs.
#[test]
fn a_crash_a_hang_or_a_stop_at_each_gate_ends_the_run_and_leaves_nothing() {
    // (gate, what the run says when the worker crashes there, when it hangs there, the line the
    // gate prints when it begins: the stop comes 300 ms after it)
    let cases: [(&str, &str, &str, Stop); 5] = [
        ("agents", "node w", "did not answer within 10 s", Stop::After(Duration::from_millis(1500))),
        (
            "replace",
            "--replace on w: the agent's connection closed",
            "--replace: w did not answer within 4 s",
            Stop::OnLine("--replace"),
        ),
        ("preflight", "preflight failed", "preflight failed", Stop::OnLine("==> preflight on every node")),
        ("weights", "w: weights check", "w: weights check", Stop::OnLine("==> weights (model)")),
        ("engines", "rank on w is gone", "no engine start reported within 2 s", Stop::OnLine("node w: starting")),
    ];
    for (gate, crashed, hung, stop) in cases {
        let (preflight, replace) = (gate == "preflight", gate == "replace");
        // The engines gate comes after the weights: the worker gets them by rsync.
        let sync = if gate == "engines" { WeightSync::Rsync } else { WeightSync::Shared };
        let r = rig(&scenario("crash", gate), sync, 1);
        let o = run_rig(&r, &r.gates(preflight, replace), Stop::Never);
        let e = o.result.clone().err().unwrap_or_else(|| format!("exit {:?}", o.result));
        let said = format!("{e} {}", o.lines.join("\n"));
        assert!(said.contains(crashed), "crash at {gate}: {said}");
        assert_eq!(o.state, State::Failed, "crash at {gate}: {said}");
        r.assert_clean_by(o.ended + Duration::from_secs(2));

        let r = rig(&scenario("hang", gate), sync, 1);
        let t = Instant::now();
        let o = run_rig(&r, &r.gates(preflight, replace), Stop::Never);
        let e = o.result.clone().err().unwrap_or_else(|| format!("exit {:?}", o.result));
        let said = format!("{e} {}", o.lines.join("\n"));
        assert!(said.contains(hung), "hang at {gate}: {said}");
        assert_eq!(o.state, State::Failed, "hang at {gate}: {said}");
        assert!(t.elapsed() < Duration::from_secs(20), "hang at {gate} took {:?}", t.elapsed());
        r.assert_clean_by(o.ended + Duration::from_secs(2));

        let r = rig(&scenario("hang", gate), sync, 1);
        let o = run_rig(&r, &r.gates(preflight, replace), stop);
        let took = o.stop_took.unwrap_or_else(|| panic!("stop at {gate}: never asked: {:#?}", o.lines));
        // Once engines are being started the stop goes through every agent (one whose engine
        // never started is given 1.2 s to answer, then killed), and still ends within 2 s.
        assert!(took < Duration::from_secs(2), "stop at {gate} took {took:?}: {:#?}", o.lines);
        r.assert_clean_by(o.ended + Duration::from_secs(2));
        assert_eq!((o.result, o.state), (Ok(0), State::Stopped), "stop at {gate}: {:#?}", o.lines);
    }
}

/// A dangling link in the head's tree stops the weights gate before anything is copied, naming
/// the link (exit 2: bad input on the head).
#[test]
fn a_dangling_link_on_the_head_stops_before_any_copy_naming_it() {
    let r = rig("{}", WeightSync::Rsync, 1);
    std::os::unix::fs::symlink("../../blobs/ab/gone", r.tree.join("blobs/e1")).unwrap();
    let h = Handles::new(&r.kit);
    let rep = Lines {
        lines: Mutex::new(Vec::new()),
        stop: Arc::clone(&h.stop),
        trigger: Stop::Never,
        stopped_at: Arc::default(),
    };
    let e = run(&r.kit, &r.dir.path().join("logs"), Policy::default(), &rep, h, &r.gates(false, false)).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "the head's weights: {}/blobs/e1 is a symlink to ../../blobs/ab/gone, which does not exist; nothing was copied",
            r.tree.display()
        )
    );
    assert!(e.is_usage(), "{e:?}");
    assert!(e.hint().is_some_and(|h| h.starts_with("run `spark-kit download`")), "{e:?}");
    let lines = rep.lines.into_inner().unwrap();
    assert!(!lines.iter().any(|l| l.contains("rsync")), "{lines:#?}");
    assert!(!r.dir.path().join("home-w/hub").exists(), "something was copied");
}

/// The exec transport's rsync is the one the gate runs: a worker path under its own home.
#[test]
fn the_worker_reads_the_copy_under_its_own_home() {
    let r = rig("{}", WeightSync::Rsync, 1);
    let mut gates = r.gates(false, false);
    gates.engines = false;
    let o = run_rig(&r, &gates, Stop::Never);
    assert_eq!(o.result, Ok(0), "{:#?}", o.lines);
    assert!(Path::new(&r.dir.path().join("home-w/hub/models--o--w/blobs/b")).is_file());
    assert!(o.lines.iter().any(|l| l.contains("under ~/hub/models--o--w")), "{:#?}", o.lines);
}
