//! Issue 29 item 10: after the README's set-up, the commands spark-kit prints run as printed.
//! The README's quick start puts the built `spark-kit` on `PATH`; this runs its lines in a
//! shell, takes a hint from the binary invoked by its full path (as `cargo run` invokes it), and
//! runs the hint's program and the issue's `spark-kit status --kit tiny-cpu` as printed: found,
//! never `command not found` (exit 127).

use std::path::Path;
use std::process::Command;

fn readme_quick_start() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let block = readme.split("```sh\n").nth(1).unwrap().split("```").next().unwrap();
    block.lines().map(str::to_string).collect()
}

#[test]
fn the_readme_set_up_makes_printed_commands_run() {
    let lines = readme_quick_start();
    // One set-up command (the brief: the README has exactly two, this one and the test suite's).
    assert_eq!(lines, ["cargo build && export PATH=\"$PWD/target/debug:$PATH\" && spark-kit up --kit tiny-cpu"]);
    let exe = Path::new(env!("CARGO_BIN_EXE_spark-kit"));
    let home = tempfile::tempdir().unwrap();
    // The hint as a `cargo run` session prints it (the binary by its full path).
    let o = Command::new(exe).args(["status", "--kit", "tiny-cpu"]).env("HOME", home.path()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    let hint = err.split('`').nth(1).unwrap_or_else(|| panic!("no hint in: {err}"));
    assert!(hint.starts_with("spark-kit "), "{hint}");
    // The README's export, run where cargo put the binary (its `$PWD/target` under a default
    // CARGO_TARGET_DIR), then the hint's program and the issue's command as printed.
    let target = exe.parent().unwrap().parent().unwrap();
    let export = lines[0].split(" && ").nth(1).unwrap().replace("$PWD/target", &target.display().to_string());
    let script = format!("{export}\ncommand -v spark-kit\nspark-kit status --kit tiny-cpu");
    let o = Command::new("sh")
        .args(["-c", &script])
        .env("HOME", home.path())
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(out.trim(), exe.display().to_string(), "{err}");
    assert_ne!(o.status.code(), Some(127), "{err}");
    assert!(err.contains("no deployment of kit tiny-cpu is running here"), "{err}");
}
