//! Per-command kit validation: a command validates only the parts of the kit it uses (`download`
//! and `verify` need `model`/`engram`, not `engine`), and `spark-kit kit check` validates every
//! part, saying for each problem which commands need the key.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fake_hub;

use fake_hub::Setup;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The harness kit without `engine.requirements` and `engine.served_model_name`.
fn without_engine(s: &Setup) {
    let kit = std::fs::read_to_string(&s.kit).unwrap();
    let kit = kit.replace("  requirements: engine-tiny-cpu\n", "").replace("  served_model_name: tiny\n", "");
    let kit = kit.replace("engine:\n", "");
    assert!(!kit.contains("served_model_name") && !kit.contains("requirements"), "{kit}");
    std::fs::write(&s.kit, kit).unwrap();
}

#[test]
fn download_and_verify_need_no_engine_section() {
    let s = Setup::new(None);
    without_engine(&s);
    let j = s.download_ok(&[]);
    assert_eq!(j["downloaded_files"], 6);
    let out = s.cmd(&["verify"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    // A command that starts the engine still refuses the kit, naming the key.
    let out = s.cmd(&["config"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("engine.served_model_name: empty"), "{}", text(&out.stderr));
}

#[test]
fn a_bad_model_key_still_stops_download() {
    let s = Setup::new(None);
    without_engine(&s);
    let out = s.cmd(&["download", "--set", "model.repo=not a repo"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("model.repo: `not a repo` is not a Hub repo id"), "{}", text(&out.stderr));
}

#[test]
fn kit_check_says_which_command_needs_what() {
    let s = Setup::new(None);
    without_engine(&s);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spark-kit"))
        .args(["kit", "check"])
        .arg(&s.kit)
        .env_clear()
        .env("HOME", s.dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let o = text(&out.stdout);
    let line = o.lines().find(|l| l.contains("engine.served_model_name: empty")).unwrap_or_else(|| panic!("{o}"));
    assert!(line.contains("needed by: ") && line.contains("up") && !line.contains("download"), "{line}");
    let line = o.lines().find(|l| l.contains("engine.requirements")).unwrap_or_else(|| panic!("{o}"));
    assert!(line.contains("setup"), "{line}");
    assert!(o.contains("usable by: download, verify"), "{o}");
    assert!(text(&out.stderr).starts_with("error: kit "), "{}", text(&out.stderr));
    // A built-in kit is valid for every command.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spark-kit"))
        .args(["kit", "check", "tiny-cpu"])
        .env_clear()
        .env("HOME", s.dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("valid for every command"), "{}", text(&out.stdout));
}
