//! Preflight over recorded nodes (tests/fixtures/node/*: sysfs trees, /proc files and command
//! outputs): a healthy GB10 pair, broken GID tables (all-zero, IPv6-only, RoCE v1 only), link
//! down, low memory, a leftover GPU process, an old driver and an MTU mismatch on one node.
//! Each check's verdict and message are asserted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use spark_kit::cluster::protocol::{decode, encode, Event};
use spark_kit::kit::{self, schema::Kit};
use spark_kit::node::checks::{Check, Verdict};
use spark_kit::node::facts::{gather, FactRequest};
use spark_kit::node::preflight::{run, FactsError, PreflightInput};
use spark_kit::node::{RecordedProbe, Report};

const GIB: u64 = 1 << 30;

fn kit_2x() -> Kit {
    kit::resolve(kit::source(Some("dgx-spark-2x-dsv41-exl3")).unwrap(), &[], &[]).unwrap().kit
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/node").join(name)
}

fn input() -> PreflightInput {
    PreflightInput {
        // The reference kit's weight budget (reference-kit.md A.3 step 9: ~99.5 GiB per rank).
        weights_per_rank: Some(99 * GIB + GIB / 2),
        weights_on_disk: Some(390 * GIB),
        disk_path: "/models/dsv41".into(),
        vllm_python: Some("/opt/engine/bin/python".into()),
        image_build: None,
        image_sync: None,
        replace: None,
        gateway_holds_api_port: false,
        setup: Some("spark-kit setup --kit dgx-spark-2x-dsv41-exl3".into()),
        image_vllm_cache: None,
        recorded_image: None,
        running: None,
        all_reduce: false,
    }
}

/// Run preflight on the 2x Spark kit with the head and worker replayed from fixtures.
fn preflight(kit: &Kit, head: &str, worker: Option<&str>) -> Report {
    let (head, worker) = (fixture(head), worker.map(fixture));
    let source = |n: &kit::schema::Node, req: &FactRequest| -> spark_kit::node::preflight::Facts {
        let root = if n.name == "spark-1" { Some(head.clone()) } else { worker.clone() };
        root.map(|root| gather(&RecordedProbe { root }, req))
            .ok_or_else(|| FactsError::Unreachable { node: n.name.clone(), why: "no answer".into() })
    };
    run(kit, &input(), &source)
}

fn check<'a>(r: &'a Report, node: &str, id: &str) -> &'a Check {
    r.checks
        .iter()
        .find(|c| c.node == node && c.id == id)
        .unwrap_or_else(|| panic!("no {id} check for {node}: {:#?}", r.checks))
}

fn assert_check(r: &Report, node: &str, id: &str, verdict: Verdict, message_has: &str) {
    let c = check(r, node, id);
    assert_eq!(c.verdict, verdict, "{node}/{id}: {c:?}");
    assert!(c.message.contains(message_has), "{node}/{id}: `{}` lacks `{message_has}`", c.message);
    if matches!(verdict, Verdict::Warn | Verdict::Fail | Verdict::NotChecked) {
        let fix = c.fix.as_deref().unwrap_or("");
        assert!(!fix.is_empty() && !fix.contains('\n'), "{node}/{id}: a one-line fix is required: {c:?}");
    }
}

#[test]
fn healthy_pair_passes_every_check() {
    let r = preflight(&kit_2x(), "gb10-healthy", Some("gb10-healthy-worker"));
    let bad: Vec<&Check> = r.checks.iter().filter(|c| c.verdict != Verdict::Pass).collect();
    assert!(bad.is_empty(), "{bad:#?}");
    assert_eq!(r.status, Verdict::Pass);
    assert_check(&r, "spark-1", "gpu", Verdict::Pass, "NVIDIA GB10 compute capability 12.1, driver 580.95.05");
    assert_check(
        &r,
        "spark-1",
        "memory",
        Verdict::Pass,
        "MemAvailable 115.9 GiB ≥ weights 99.5 GiB + boot margin 12.0 GiB",
    );
    assert_check(&r, "spark-1", "leftovers", Verdict::Pass, "no GPU processes");
    assert_check(&r, "spark-1", "disk", Verdict::Pass, "free for the weights");
    assert_check(
        &r,
        "spark-1",
        "vllm",
        Verdict::Pass,
        "vLLM 0.34.0 in the engine venv (supported: 0.32.0, 0.33.0, 0.34.0)",
    );
    assert_check(&r, "spark-1", "link", Verdict::Pass, "enp1s0f1np1 up, 200000 Mb/s, MTU 9000");
    assert_check(&r, "spark-1", "ipv4", Verdict::Pass, "192.168.100.10");
    // Never a fixed index: the head's GID is at 3, the worker's at 5.
    assert_check(
        &r,
        "spark-1",
        "roce-gid",
        Verdict::Pass,
        "rocep1s0f1 port 1 GID index 3: RoCE v2 ::ffff:192.168.100.10",
    );
    assert_check(
        &r,
        "spark-2",
        "roce-gid",
        Verdict::Pass,
        "rocep1s0f0 port 1 GID index 5: RoCE v2 ::ffff:192.168.100.11",
    );
    assert_check(&r, "spark-1", "ssh", Verdict::Pass, "ssh to spark-2 in batch mode works");
    assert_check(&r, "spark-1", "ports", Verdict::Pass, "API port 8888 is free");
    assert_check(&r, "spark-1", "clock", Verdict::Pass, "synchronised");
    assert_check(&r, "spark-1", "firewall", Verdict::Pass, "nothing blocks 192.168.100.0/24 on enp1s0f1np1");
    assert_check(&r, "spark-1", "psi", Verdict::Pass, "PSI");
    for id in ["same-driver", "same-kernel", "same-spark-kit", "same-vllm", "same-mtu", "same-speed"] {
        assert_check(&r, "all", id, Verdict::Pass, "spark-1, spark-2");
    }
}

/// A copy of fixture `name` with `cmd/<file>` replaced by `text` (a node that differs in one answer).
fn fixture_with(name: &str, file: &str, text: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let copied =
        std::process::Command::new("cp").arg("-a").arg(fixture(name)).arg(d.path().join("n")).status().unwrap();
    assert!(copied.success());
    std::fs::write(d.path().join("n/cmd").join(file), text).unwrap();
    d
}

fn preflight_at(kit: &Kit, head: &std::path::Path, worker: &std::path::Path, input: &PreflightInput) -> Report {
    let source = |n: &kit::schema::Node, req: &FactRequest| -> spark_kit::node::preflight::Facts {
        let root = if n.name == "spark-1" { head.to_path_buf() } else { worker.to_path_buf() };
        Ok(gather(&RecordedProbe { root }, req))
    };
    run(kit, input, &source)
}

#[test]
fn a_venv_with_the_0909_dev_vllm_fails_naming_it_the_supported_set_and_setup() {
    let head = fixture_with("gb10-healthy", "vllm-version", "0.1.dev20904+g179dd0fa9\n");
    let r = preflight_at(&kit_2x(), &head.path().join("n"), &fixture("gb10-healthy-worker"), &input());
    assert_eq!(r.status, Verdict::Fail);
    let c = check(&r, "spark-1", "vllm");
    assert_eq!(c.verdict, Verdict::Fail);
    assert_eq!(
        c.message,
        "vLLM 0.1.dev20904+g179dd0fa9 in the engine venv is not a release the overlay supports (0.32.0, 0.33.0, 0.34.0); the kit pins 0.34.0"
    );
    assert_eq!(
        c.fix.as_deref(),
        Some("run `spark-kit setup --kit dgx-spark-2x-dsv41-exl3` on this node: it builds the venv of engine.requirements (engine-dgx-spark-cu130) with its locked vLLM")
    );
    // A supported release that is not the kit's pin fails too.
    let old = fixture_with("gb10-healthy", "vllm-version", "0.33.0\n");
    let r = preflight_at(&kit_2x(), &old.path().join("n"), &fixture("gb10-healthy-worker"), &input());
    assert_check(&r, "spark-1", "vllm", Verdict::Fail, "vLLM 0.33.0 in the engine venv; the kit pins 0.34.0");
}

fn docker_kit() -> Kit {
    kit::resolve(kit::source(Some("dgx-spark-2x-dsv41-exl3-docker")).unwrap(), &[], &[]).unwrap().kit
}

#[test]
fn the_docker_kit_reads_vllm_inside_the_image_and_never_says_setup() {
    let r = preflight(&docker_kit(), "gb10-healthy", Some("gb10-healthy-worker"));
    assert_check(
        &r,
        "spark-1",
        "vllm",
        Verdict::Pass,
        "vLLM 0.34.0 in image vllm/vllm-openai:v0.34.0-aarch64 (5f1c0e7d2a9b)",
    );
    let head = fixture_with("gb10-healthy", "docker-vllm", "0.1.dev20904+g179dd0fa9\n");
    let r = preflight_at(&docker_kit(), &head.path().join("n"), &fixture("gb10-healthy-worker"), &input());
    let c = check(&r, "spark-1", "vllm");
    assert_eq!(c.verdict, Verdict::Fail);
    assert!(c.message.starts_with("vLLM 0.1.dev20904+g179dd0fa9 in image vllm/vllm-openai:v0.34.0-aarch64 (5f1c0e7d2a9b) is not a release the overlay supports (0.32.0, 0.33.0, 0.34.0)"), "{}", c.message);
    let fix = c.fix.as_deref().unwrap();
    assert!(
        fix.contains("vllm/vllm-openai:v0.34.0-aarch64") && fix.contains("docker pull") && !fix.contains("setup"),
        "{fix}"
    );
    // A venv is not asked for: the docker kit's vLLM is the image's.
    assert!(!r.checks.iter().any(|c| c.message.contains("engine venv")), "{:#?}", r.checks);
}

#[test]
fn an_image_id_other_than_the_recorded_one_fails_on_that_node() {
    let worker = fixture_with(
        "gb10-healthy-worker",
        "docker-image",
        "sha256:1111111111111111111111111111111111111111111111111111111111111111\n",
    );
    let recorded = "sha256:5f1c0e7d2a9b8c4e3f6a1d0b9c8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e";
    let input = PreflightInput { recorded_image: Some((recorded.into(), "/d/spark-kit.lock".into())), ..input() };
    let r = preflight_at(&docker_kit(), &fixture("gb10-healthy"), &worker.path().join("n"), &input);
    assert_check(&r, "spark-1", "image", Verdict::Pass, "is here (5f1c0e7d2a9b)");
    assert_check(&r, "spark-2", "image", Verdict::Fail, &format!("but /d/spark-kit.lock recorded {recorded} for it"));
    assert_check(&r, "all", "image-id", Verdict::Fail, "differs between nodes");
    assert_eq!(r.status, Verdict::Fail);
}

#[test]
fn broken_gid_tables_fail_with_the_reason() {
    let kit = kit_2x();
    let cases = [
        ("gid-all-zero", "every GID is all-zero", "bring enp1s0f1np1 up with its IPv4"),
        ("gid-ipv6-only", "only IPv6 GIDs, none for 192.168.100.10", "assign 192.168.100.10 to enp1s0f1np1"),
        ("gid-roce-v1-only", "exists only as RoCE v1 (index 1); NCCL needs RoCE v2", "enable RoCE v2 on rocep1s0f1"),
    ];
    for (fx, msg, fix) in cases {
        let r = preflight(&kit, fx, Some("gb10-healthy-worker"));
        assert_check(&r, "spark-1", "roce-gid", Verdict::Fail, msg);
        assert!(check(&r, "spark-1", "roce-gid").fix.as_deref().unwrap().contains(fix), "{fx}");
        assert_eq!(r.status, Verdict::Fail, "{fx}");
        // The rest of the node is fine.
        assert_check(&r, "spark-1", "gpu", Verdict::Pass, "GB10");
    }
}

#[test]
fn a_pinned_gid_index_that_does_not_match_this_node_fails() {
    let mut kit = kit_2x();
    kit.engine.extra_env.insert("NCCL_IB_GID_INDEX".into(), "3".into());
    let r = preflight(&kit, "gb10-healthy", Some("gb10-healthy-worker"));
    assert_check(&r, "spark-1", "roce-gid", Verdict::Pass, "GID index 3");
    assert_check(
        &r,
        "spark-2",
        "roce-gid",
        Verdict::Fail,
        "NCCL_IB_GID_INDEX=3, but this node's RoCE v2 GID for 192.168.100.11 is index 5",
    );
}

#[test]
fn link_down_fails_link_and_gid() {
    let r = preflight(&kit_2x(), "link-down", Some("gb10-healthy-worker"));
    assert_check(&r, "spark-1", "link", Verdict::Fail, "enp1s0f1np1 is down, not up");
    assert_check(&r, "spark-1", "roce-gid", Verdict::Fail, "all-zero");
    assert_check(&r, "all", "same-speed", Verdict::Fail, "fabric link speed differs: spark-1 -1, spark-2 200000");
}

#[test]
fn low_memory_fails_the_boot_margin() {
    let r = preflight(&kit_2x(), "low-memory", Some("gb10-healthy-worker"));
    assert_check(
        &r,
        "spark-1",
        "memory",
        Verdict::Fail,
        "MemAvailable 100.0 GiB < weights 99.5 GiB + boot margin 12.0 GiB (short by 11.5 GiB)",
    );
    assert_check(&r, "spark-2", "memory", Verdict::Pass, "MemAvailable 115.9 GiB");
}

#[test]
fn leftover_gpu_process_fails() {
    let r = preflight(&kit_2x(), "leftover-gpu-process", Some("gb10-healthy-worker"));
    assert_check(
        &r,
        "spark-1",
        "leftovers",
        Verdict::Fail,
        "2 leftover engine/GPU process(es): 48121 (VLLM::Worker_TP, 91416 MiB GPU), 5150 (VLLM::Worker_TP0)",
    );
}

#[test]
fn a_leftover_vllm_only_warns_for_a_cpu_kit() {
    // The CPU build's engine memory is ordinary memory the kernel sees: another vLLM only competes
    // for cores. The GPU processes nvidia-smi lists are not looked at for a CPU kit.
    let kit = kit::resolve(kit::source(Some("tiny-cpu")).unwrap(), &[], &[]).unwrap().kit;
    let source = |_: &kit::schema::Node, req: &FactRequest| -> spark_kit::node::preflight::Facts {
        Ok(gather(&RecordedProbe { root: fixture("leftover-gpu-process") }, req))
    };
    let r = run(&kit, &PreflightInput { disk_path: "/models/tiny".into(), ..PreflightInput::default() }, &source);
    assert_check(
        &r,
        "local",
        "leftovers",
        Verdict::Warn,
        "1 other vLLM/Ray process(es) on this node: 5150 (VLLM::Worker_TP0)",
    );
}

#[test]
fn old_driver_on_one_node_fails_there_and_in_parity() {
    let r = preflight(&kit_2x(), "gb10-healthy", Some("worker-old-driver"));
    assert_check(&r, "spark-2", "gpu", Verdict::Fail, "driver 570.86.10: older than 580");
    assert_check(&r, "spark-1", "gpu", Verdict::Pass, "driver 580.95.05");
    assert_check(
        &r,
        "all",
        "same-driver",
        Verdict::Fail,
        "NVIDIA driver differs: spark-1 580.95.05, spark-2 570.86.10",
    );
}

#[test]
fn mtu_mismatch_fails_parity_and_warns_at_1500() {
    let r = preflight(&kit_2x(), "gb10-healthy", Some("worker-mtu-1500"));
    assert_check(&r, "all", "same-mtu", Verdict::Fail, "fabric MTU differs: spark-1 9000, spark-2 1500");
    assert_check(&r, "spark-2", "link", Verdict::Warn, "MTU 1500: jumbo frames off");
}

#[test]
fn a_remote_node_whose_agent_does_not_answer_is_not_checked_never_passed() {
    let r = preflight(&kit_2x(), "gb10-healthy", None);
    assert_check(&r, "spark-2", "node", Verdict::NotChecked, "not checked: spark-2's node agent: no answer");
    assert_check(&r, "all", "parity", Verdict::NotChecked, "not checked");
    assert!(r.checks.iter().all(|c| c.node != "spark-2" || c.verdict == Verdict::NotChecked));
    assert_eq!(r.status, Verdict::NotChecked);
}

#[test]
fn ssh_is_checked_both_ways() {
    let r = preflight(&kit_2x(), "gb10-healthy", Some("gb10-healthy-worker"));
    assert_check(&r, "spark-1", "ssh", Verdict::Pass, "ssh to spark-2 in batch mode works");
    assert_check(&r, "spark-2", "ssh", Verdict::Pass, "ssh to spark-1 in batch mode works");
    let r = preflight(&kit_2x(), "gb10-healthy", Some("worker-no-ssh-back"));
    assert_check(&r, "spark-2", "ssh", Verdict::Fail, "ssh to spark-1 in batch mode failed: ");
    assert_eq!(r.status, Verdict::Fail);
}

#[test]
fn the_facts_survive_the_agent_protocol() {
    // The worker's facts travel as JSON (protocol Event::Facts): the verdicts must not change.
    let kit = kit_2x();
    let direct = preflight(&kit, "gb10-healthy", Some("worker-old-driver"));
    let source = |n: &kit::schema::Node, req: &FactRequest| -> spark_kit::node::preflight::Facts {
        let root = fixture(if n.name == "spark-1" { "gb10-healthy" } else { "worker-old-driver" });
        let facts = gather(&RecordedProbe { root }, req);
        let line = encode(&Event::Facts { facts: Box::new(facts) }).unwrap();
        match decode::<Event>(&line).unwrap() {
            Event::Facts { facts } => Ok(*facts),
            other => panic!("{other:?}"),
        }
    };
    let wired = run(&kit, &input(), &source);
    assert_eq!(serde_json::to_value(&direct).unwrap(), serde_json::to_value(&wired).unwrap());
    assert_eq!(wired.status, Verdict::Fail);
}

#[test]
fn a_cpu_kit_skips_the_gpu_checks() {
    let kit = kit::resolve(kit::source(Some("tiny-cpu")).unwrap(), &[], &[]).unwrap().kit;
    let source = |_: &kit::schema::Node, req: &FactRequest| -> spark_kit::node::preflight::Facts {
        Ok(gather(&RecordedProbe { root: fixture("gb10-healthy") }, req))
    };
    let r = run(&kit, &PreflightInput { disk_path: "/models/tiny".into(), ..PreflightInput::default() }, &source);
    assert_check(&r, "local", "gpu", Verdict::Skip, "the kit runs on the CPU");
    assert_check(&r, "local", "link", Verdict::Skip, "no fabric interface");
    // Issue 29 item 12: no warning whose fix cannot apply to the kit: its model is made on the
    // first start (no download to do), and one node has no other clock to agree with.
    assert_check(&r, "local", "memory", Verdict::Skip, "tiny model is made on the first start");
    assert_check(&r, "local", "ports", Verdict::Pass, "API port 8000 is free");
    let no_systemd = tempfile::tempdir().unwrap();
    let root = no_systemd.path().join("n");
    assert!(std::process::Command::new("cp")
        .arg("-a")
        .arg(fixture("gb10-healthy"))
        .arg(&root)
        .status()
        .unwrap()
        .success());
    std::fs::remove_file(root.join("cmd/timedatectl")).unwrap();
    let source = |_: &kit::schema::Node, req: &FactRequest| -> spark_kit::node::preflight::Facts {
        Ok(gather(&RecordedProbe { root: root.clone() }, req))
    };
    let r = run(&kit, &PreflightInput { disk_path: "/models/tiny".into(), ..PreflightInput::default() }, &source);
    assert_check(&r, "local", "clock", Verdict::Skip, "timedatectl is not installed): one node");
    let warned: Vec<_> = r.checks.iter().filter(|c| c.verdict == Verdict::Warn).collect();
    assert!(warned.is_empty(), "{warned:?}");
}

#[test]
fn an_absent_fabric_address_names_the_key_it_came_from() {
    // Issue 21 item 6: the head's fabric interface is up but carries no IPv4, so the master port
    // (bound on nodes[].fabric.ipv4) cannot be checked; the fix names that key, not engine.host.
    let r = preflight(&kit_2x(), "fabric-address-absent", Some("gb10-healthy-worker"));
    assert_check(&r, "spark-1", "ipv4", Verdict::Fail, "does not carry the kit's address 192.168.100.10");
    let master = r
        .checks
        .iter()
        .find(|c| c.node == "spark-1" && c.id == "ports" && c.message.contains("master"))
        .unwrap_or_else(|| panic!("{:#?}", r.checks));
    assert_eq!(master.verdict, Verdict::Fail);
    assert!(master.message.contains("Cannot assign requested address"), "{}", master.message);
    let fix = master.fix.as_deref().unwrap();
    assert!(fix.contains("nodes[].fabric.ipv4 (192.168.100.10)"), "{fix}");
    assert!(fix.contains("`ip addr add 192.168.100.10/24 dev enp1s0f1np1`"), "{fix}");
    assert!(!fix.contains("engine.host"), "{fix}");
    // The API port binds engine.host (127.0.0.1 in the kit): checked normally.
    assert!(r.checks.iter().any(|c| c.node == "spark-1" && c.id == "ports" && c.verdict == Verdict::Pass));
}

#[test]
fn the_firewall_is_not_checked_on_a_failed_link() {
    // Issue 21 item 6: rules for an interface that is down say nothing about the link.
    let r = preflight(&kit_2x(), "link-down", Some("gb10-healthy-worker"));
    assert_check(&r, "spark-1", "link", Verdict::Fail, "is down");
    assert_check(&r, "spark-1", "firewall", Verdict::Skip, "not checked: the link check of enp1s0f1np1 failed");
    // A healthy link still gets its firewall check.
    assert_check(&r, "spark-2", "firewall", Verdict::Pass, "nothing blocks");
}
