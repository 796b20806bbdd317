//! `spark-kit preflight` on this machine: local nodes are probed for real, remote nodes are
//! "not checked" (never passed), the exit code follows the verdict, bad input is exit 2.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::spark_kit;

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn tiny_cpu_runs_every_local_check_and_exits_by_verdict() {
    let out = spark_kit().args(["preflight", "--kit", "tiny-cpu", "--json"]).output().unwrap();
    let r = json(&out);
    let checks = r["checks"].as_array().unwrap();
    let ids: Vec<&str> = checks.iter().map(|c| c["id"].as_str().unwrap()).collect();
    for id in ["gpu", "memory", "psi", "leftovers", "disk", "vllm", "link", "ports", "clock", "firewall"] {
        assert!(ids.contains(&id), "{id} missing from {ids:?}");
    }
    assert!(checks.iter().all(|c| c["node"] == "local" && !c["message"].as_str().unwrap().is_empty()));
    let gpu = checks.iter().find(|c| c["id"] == "gpu").unwrap();
    assert_eq!(gpu["verdict"], "skip");
    let failed = checks.iter().any(|c| c["verdict"] == "fail");
    assert_eq!(r["status"], if failed { "fail" } else { "pass" });
    assert_eq!(out.status.code(), Some(if failed { 1 } else { 0 }), "{}", String::from_utf8_lossy(&out.stderr));
    for c in checks.iter().filter(|c| c["verdict"] == "fail" || c["verdict"] == "warn") {
        assert!(!c["fix"].as_str().unwrap().is_empty(), "{c}");
    }
}

#[test]
fn two_node_kit_marks_the_remote_node_not_checked() {
    // Loopback only: the worker's ssh host is pointed at this machine.
    let out = spark_kit()
        .args(["preflight", "--kit", "dgx-spark-2x-dsv41-exl3", "--set", "nodes.1.ssh_host=127.0.0.1", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let r = json(&out);
    let checks = r["checks"].as_array().unwrap();
    let remote: Vec<_> = checks.iter().filter(|c| c["node"] == "spark-2").collect();
    assert_eq!(remote.len(), 1);
    assert_eq!(remote[0]["verdict"], "not-checked");
    assert!(checks.iter().any(|c| c["node"] == "spark-1" && c["id"] == "gpu"));
    assert!(checks.iter().any(|c| c["node"] == "spark-1" && c["id"] == "ssh"));
    assert_ne!(r["status"], "pass");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error: preflight"), "{err}");
    // Issue 21 item 6: JSON has no FAIL lines, so the human hint about them is not printed.
    assert!(!err.contains("each FAIL line above"), "{err}");
    // This machine does not carry the kit's fabric address: the master port's fix names the key
    // the address came from, and the firewall of the missing interface is not checked.
    let master = checks.iter().find(|c| c["node"] == "spark-1" && c["id"] == "ports" && c["verdict"] == "fail");
    if let Some(m) = master {
        assert!(m["fix"].as_str().unwrap().contains("nodes[].fabric.ipv4"), "{m}");
    }
    let link = checks.iter().find(|c| c["node"] == "spark-1" && c["id"] == "link").unwrap();
    if link["verdict"] == "fail" {
        let fw = checks.iter().find(|c| c["node"] == "spark-1" && c["id"] == "firewall").unwrap();
        assert_eq!(fw["verdict"], "skip", "{fw}");
    }
}

#[test]
fn human_failure_keeps_its_hint() {
    let out = spark_kit()
        .args(["preflight", "--kit", "dgx-spark-2x-dsv41-exl3", "--set", "nodes.1.transport=local"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hint: each FAIL line above says what to fix"));
}

#[test]
fn human_output_has_a_table_and_a_summary() {
    let out = spark_kit().args(["preflight", "--kit", "tiny-cpu"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("NODE"), "{text}");
    assert!(text.contains(" pass, ") && text.contains(" not checked"), "{text}");
}

#[test]
fn bad_kit_is_a_usage_error() {
    let out = spark_kit().args(["preflight", "--kit", "no-such-kit"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = spark_kit().args(["preflight", "--kit", "tiny-cpu", "--set", "engine.port=70000"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("engine.port"));
}

/// `preflight` in a fresh HOME (not /root), without the `HF_*` variables of the test's own
/// environment.
fn preflight_in(home: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut cmd = spark_kit();
    cmd.env("HOME", home).env_remove("HF_HUB_CACHE").env_remove("HF_HOME").env_remove("XDG_CACHE_HOME");
    cmd.args(["preflight", "--kit", "tiny-cpu", "--json"]).args(args).output().unwrap()
}

fn check<'a>(r: &'a serde_json::Value, id: &str) -> Vec<&'a serde_json::Value> {
    r["checks"].as_array().unwrap().iter().filter(|c| c["id"] == id).collect()
}

/// #28: preflight measures a downloaded model in the HF cache under the user's own HOME (it
/// read the lock and cache of HOME=/root whatever the user, so the weights were "unknown").
#[test]
fn a_downloaded_model_is_found_under_a_home_that_is_not_root() {
    let home = tempfile::tempdir().unwrap();
    let repo = home.path().join(".cache/huggingface/hub/models--acme--tiny");
    let commit = "c".repeat(40);
    let snap = repo.join("snapshots").join(&commit);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), &commit).unwrap();
    let header = r#"{"model.layers.0.mlp.down_proj.weight":{"dtype":"F16","shape":[64,64],"data_offsets":[0,8192]}}"#;
    let mut file = u64::try_from(header.len()).unwrap().to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend(std::iter::repeat_n(0u8, 8192));
    std::fs::write(snap.join("model.safetensors"), file).unwrap();
    std::fs::write(snap.join("config.json"), "{}").unwrap();
    let sets = ["--set", "model.source=hub", "--set", "model.repo=acme/tiny", "--set", "model.revision=main"];
    let out = preflight_in(home.path(), &sets);
    let r = json(&out);
    let memory = check(&r, "memory");
    let message = memory[0]["message"].as_str().unwrap();
    assert!(!message.contains("weights per rank unknown"), "{message}");
    assert!(message.contains("≥ weights") || message.contains("weights"), "{message}");
    let disk = check(&r, "disk");
    assert_eq!(disk[0]["message"], format!("weights already in {}", repo.display()));
}

/// #28: preflight while the kit's own deployment runs says so; its ports and engine are not
/// reported as a conflict to kill (the ports FAILed "in use" with "stop what listens there").
#[test]
fn a_running_deployment_is_reported_as_running_not_as_a_conflict() {
    use spark_kit::supervisor::{control, state::State, Handles};
    let home = tempfile::tempdir().unwrap();
    let (api, internal) =
        (std::net::TcpListener::bind("127.0.0.1:0").unwrap(), std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let (api_port, internal_port) = (api.local_addr().unwrap().port(), internal.local_addr().unwrap().port());
    let sets = [
        "--set".to_string(),
        format!("engine.port={api_port}"),
        "--set".into(),
        format!("engine.internal_port={internal_port}"),
    ];
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    // Before it runs: the held ports are a conflict.
    let r = json(&preflight_in(home.path(), &sets));
    assert!(check(&r, "ports").iter().any(|c| c["verdict"] == "fail"), "{r}");
    // The deployment's supervisor answers on the kit's control socket.
    let kit = spark_kit::kit::resolve(spark_kit::kit::source(Some("tiny-cpu")).unwrap(), &[], &[]).unwrap().kit;
    let d =
        spark_kit::deploy::Deployment::resolve(&kit, &[("HOME".into(), home.path().display().to_string())]).unwrap();
    std::fs::create_dir_all(&d.logs).unwrap();
    let handles = Handles::new(&kit);
    handles.snapshot.lock().unwrap().state = State::Ready;
    handles.snapshot.lock().unwrap().supervisor_pid = 4242;
    control::serve(&control::socket_path(&d.logs, &kit.name), handles).unwrap();
    let out = preflight_in(home.path(), &sets);
    let (r, err) = (json(&out), String::from_utf8_lossy(&out.stderr).into_owned());
    let ports = check(&r, "ports");
    assert_eq!(ports.len(), 1, "{ports:?}");
    assert_eq!(ports[0]["verdict"], "skip", "{r}");
    let said = "kit tiny-cpu is running here (supervisor pid 4242, ready)";
    assert!(ports[0]["message"].as_str().unwrap().starts_with(said), "{r}");
    assert_eq!(check(&r, "leftovers")[0]["verdict"], "skip", "{r}");
    assert!(err.contains(&format!("preflight: {said}: its ports")), "{err}");
    assert!(!check(&r, "ports").iter().any(|c| c["fix"].as_str().is_some_and(|f| f.contains("stop what listens"))));
    drop((api, internal));
}
