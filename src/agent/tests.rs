//! The agent in process, fed commands through a real pipe: a `Stop` that lands while the
//! engine's preparation runs a real subprocess (the tiny model maker, here a script posing as
//! the engine venv's python that stages a half-made model, starts a grandchild and blocks) is
//! answered within 2 s, with no process of the maker's group left and no model, whole or
//! half-made, in place.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use super::run::{run, Emit};
use crate::cluster::protocol::{encode, Command, Event};
use crate::engine::pgroup;
use crate::kit::schema::{GuardPolicy, ModelSource};

struct Sent(mpsc::Sender<Event>);
impl Emit for Sent {
    fn emit(&mut self, ev: &Event) {
        let _ = self.0.send(ev.clone());
    }
}

/// The next event `want` accepts within `secs`, the others on the way collected.
fn wait_for(rx: &Receiver<Event>, secs: u64, seen: &mut Vec<Event>, want: impl Fn(&Event) -> bool) -> Event {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let ev = rx.recv_timeout(left).unwrap_or_else(|_| panic!("not within {secs} s; heard {seen:#?}"));
        if want(&ev) {
            return ev;
        }
        seen.push(ev);
    }
}

/// A "python" that, run as the tiny maker (`<maker> --out <dir>`), stages the model beside
/// `<dir>` as the real maker does, starts a grandchild in its group, writes its pid and blocks.
fn fake_python(venv: &Path, pid_file: &Path) -> PathBuf {
    let python = venv.join("bin/python");
    std::fs::create_dir_all(python.parent().unwrap()).unwrap();
    let script = format!(
        "#!/bin/sh\nout=\"$3\"\nstage=\"$(dirname \"$out\")/.$(basename \"$out\").tmp-fake\"\n\
         mkdir -p \"$stage\" && echo '{{}}' > \"$stage/config.json\"\nsleep 300 &\necho $$ > '{}'\nwait\n",
        pid_file.display()
    );
    std::fs::write(&python, script).unwrap();
    std::process::Command::new("chmod").arg("755").arg(&python).status().unwrap();
    python
}

#[test]
fn a_stop_while_the_model_maker_runs_kills_its_group_within_2_s_and_leaves_no_model() {
    let home = tempfile::tempdir().unwrap();
    let pid_file = home.path().join("maker.pid");
    let venv = home.path().join("venv");
    fake_python(&venv, &pid_file);
    let mut kit = crate::kit::builtin_kit("tiny-cpu");
    kit.model.source = ModelSource::TinyDense;
    kit.engine.venv = Some(venv.display().to_string());
    kit.memory.guard.policy = GuardPolicy::Off;
    let env = crate::dirs::pairs(&[("HOME", &home.path().display().to_string())]);

    let (input, mut commands) = std::io::pipe().unwrap();
    let (tx, rx) = mpsc::channel();
    let agent_env = env.clone();
    let agent = std::thread::spawn(move || run(0, &agent_env, input, &mut Sent(tx)));
    let mut send = |c: &Command| writeln!(commands, "{}", encode(c).unwrap()).unwrap();
    let mut seen = Vec::new();
    wait_for(&rx, 10, &mut seen, |e| matches!(e, Event::Hello { .. }));
    send(&Command::Start { kit: Box::new(kit.clone()), node: 0 });
    wait_for(&rx, 60, &mut seen, |e| matches!(e, Event::Phase { name, .. } if name == "model"));
    let maker = crate::cancel::pid_from_file(&pid_file, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the maker did not start: {seen:#?}"));
    // The maker and its sleeping grandchild, in the maker's own group.
    assert!(pgroup::members(maker).len() >= 2, "{:?}", pgroup::members(maker));
    // The loop still answers while the maker runs.
    send(&Command::CheckFiles { root: home.path().display().to_string(), files: vec!["maker.pid".into()] });
    wait_for(&rx, 2, &mut seen, |e| matches!(e, Event::Files { .. }));

    let asked = Instant::now();
    send(&Command::Stop { drain_s: 5 });
    let stopped = wait_for(&rx, 5, &mut seen, |e| matches!(e, Event::Stopped { .. }));
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(2), "stopped after {took:?}");
    assert!(matches!(&stopped, Event::Stopped { survivors, .. } if survivors.is_empty()), "{stopped:?}");
    assert!(!seen.iter().any(|e| matches!(e, Event::Started { .. } | Event::Error { .. })), "{seen:#?}");
    let t = Instant::now();
    while !pgroup::members(maker).is_empty() {
        assert!(t.elapsed() < Duration::from_millis(500), "left running: {:?}", pgroup::members(maker));
        std::thread::sleep(Duration::from_millis(20));
    }
    // Neither the model nor the maker's staging directory is left.
    let deploy = crate::deploy::Deployment::resolve(&kit, &env).unwrap();
    let models = deploy.data_dir.join("models");
    let left: Vec<_> = std::fs::read_dir(&models).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "{left:?} in {}", models.display());

    drop(commands);
    assert_eq!(agent.join().unwrap(), 0);
}
