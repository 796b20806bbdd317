//! The kit commands through the real binary: precedence, origins, errors and exit codes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn spark(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spark-kit"));
    cmd.args(args);
    // A clean SPARK_KIT_* environment: only what the test gives.
    for (k, _) in std::env::vars() {
        if k.starts_with("SPARK_KIT_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn explain(args: &[&str], env: &[(&str, &str)]) -> Vec<serde_json::Value> {
    let mut all = vec!["config", "--explain", "--json"];
    all.extend_from_slice(args);
    let o = spark(&all, env);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn row<'a>(rows: &'a [serde_json::Value], key: &str) -> &'a serde_json::Value {
    rows.iter().find(|r| r["key"] == key).unwrap_or_else(|| panic!("no row {key}"))
}

#[test]
fn issue_example_env_then_flag() {
    let env = [("SPARK_KIT_ENGINE__PORT", "9999")];
    let rows = explain(&["--kit", "dgx-spark-2x-dsv41-exl3"], &env);
    assert_eq!(row(&rows, "engine.port")["value"], 9999);
    assert_eq!(row(&rows, "engine.port")["origin"], "env SPARK_KIT_ENGINE__PORT");
    let rows = explain(&["--kit", "dgx-spark-2x-dsv41-exl3", "--port", "7777"], &env);
    assert_eq!(row(&rows, "engine.port")["value"], 7777);
    assert_eq!(row(&rows, "engine.port")["origin"], "flag --port");
}

#[test]
fn each_layer_overrides_the_one_below() {
    // default (tiny-cpu does not set master_port) < kit < env < flag < --set
    let rows = explain(&["--kit", "tiny-cpu"], &[]);
    assert_eq!(row(&rows, "engine.master_port")["origin"], "default");
    assert_eq!(row(&rows, "engine.master_port")["value"], 29501);
    assert_eq!(row(&rows, "engine.port")["origin"], "launch-kits/tiny-cpu.yaml:15:3");
    let env = [("SPARK_KIT_ENGINE__PORT", "8100"), ("SPARK_KIT_ENGINE__MASTER_PORT", "29600")];
    let rows = explain(&["--kit", "tiny-cpu"], &env);
    assert_eq!(row(&rows, "engine.port")["value"], 8100);
    assert_eq!(row(&rows, "engine.master_port")["origin"], "env SPARK_KIT_ENGINE__MASTER_PORT");
    let rows = explain(&["--kit", "tiny-cpu", "--port", "8200"], &env);
    assert_eq!(row(&rows, "engine.port")["value"], 8200);
    let rows = explain(&["--kit", "tiny-cpu", "--port", "8200", "--set", "engine.port=8300"], &env);
    assert_eq!(row(&rows, "engine.port")["value"], 8300);
    assert_eq!(row(&rows, "engine.port")["origin"], "flag --set engine.port");
}

#[test]
fn nested_list_keys_from_env_and_set() {
    let env = [("SPARK_KIT_NODES__1__SSH_HOST", "other-spark")];
    let rows = explain(&["--kit", "dgx-spark-2x-dsv41-exl3", "--set", "nodes.0.fabric.ipv4=10.1.2.3"], &env);
    assert_eq!(row(&rows, "nodes.1.ssh_host")["value"], "other-spark");
    assert_eq!(row(&rows, "nodes.0.fabric.ipv4")["value"], "10.1.2.3");
    // Keys the kit leaves out of a list item are defaults, not the kit.
    assert_eq!(row(&rows, "nodes.1.ssh_port")["origin"], "default");
    // Byte sizes in any form; string-typed keys keep digits as text.
    let rows = explain(&["--kit", "tiny-cpu", "--kv-cache-bytes", "2.5GiB", "--served-model-name", "123"], &[]);
    assert_eq!(row(&rows, "engine.kv_cache_bytes")["value"], 2_684_354_560_u64);
    assert_eq!(row(&rows, "engine.served_model_name")["value"], "123");
}

#[test]
fn non_kit_variables_are_ignored() {
    let env = [("SPARK_KIT_TEST_ANYTHING", "x"), ("SPARK_KIT_LOG", "debug")];
    explain(&["--kit", "tiny-cpu"], &env);
}

fn bad_kit(body: &str) -> (String, i32) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.yaml");
    std::fs::write(&path, body).unwrap();
    let o = spark(&["config", "--kit", path.to_str().unwrap()], &[]);
    let err = stderr(&o).replace(path.to_str().unwrap(), "K");
    (err, o.status.code().unwrap())
}

const GOOD: &str = "name: t\nmodel:\n  source: tiny-dense\nnodes:\n  - name: a\n    role: head\nengine:\n  served_model_name: t\n  requirements: engine-tiny-cpu\n";

#[test]
fn good_kit_file_works_like_a_builtin() {
    let (err, code) = bad_kit(GOOD);
    assert_eq!((err.as_str(), code), ("", 0));
}

/// GOOD's lines 1-6 (name, model, one head node) plus an `engine:` section from line 7.
const HEAD: &str = "name: t\nmodel:\n  source: tiny-dense\nnodes:\n  - name: a\n    role: head\n";
const ENGINE: &str = "engine:\n  served_model_name: t\n  requirements: engine-tiny-cpu\n";

#[test]
fn bad_inputs_give_one_line_errors_and_exit_2() {
    let engine = |extra: &str| format!("{HEAD}{ENGINE}{extra}");
    let cases: Vec<(String, &str)> = vec![
        (engine("  prot: 1\n"), "error: K:10:3: engine.prot: unknown key `prot`; fix: did you mean `engine.port`?\n"),
        (
            engine("  port: eighty\n"),
            "error: K:10:3: engine.port: invalid type: string \"eighty\", expected a whole number ≥ 0; fix: write an integer\n",
        ),
        (engine("  port: 70000\n"), "error: K:10:3: engine.port: 70000 is out of range 1..=65535; fix: use a value between 1 and 65535\n"),
        (engine("  port: 0\n"), "error: K:10:3: engine.port: 0 is out of range 1..=65535; fix: use a value between 1 and 65535\n"),
        (
            engine("  port: abc\n"),
            "error: K:10:3: engine.port: invalid type: string \"abc\", expected a whole number ≥ 0; fix: write an integer\n",
        ),
        (
            engine("  internal_port: 70000\n"),
            "error: K:10:3: engine.internal_port: 70000 is out of range 0..=65535; fix: use a value between 0 and 65535\n",
        ),
        (
            format!("{HEAD}    ssh_port: 0\n{ENGINE}"),
            "error: K:7:5: nodes.0.ssh_port: 0 is out of range 1..=65535; fix: use a value between 1 and 65535\n",
        ),
        (
            engine("  kv_cache_bytes: 2.5 parsecs\n"),
            "error: K:10:3: engine.kv_cache_bytes: `2.5 parsecs` is not a byte size (unknown unit); write e.g. `2684354560`, `512MiB` or `2.5GiB`; fix: write a byte size\n",
        ),
        (
            engine("tensor_parallel_size: 0\n"),
            "error: K:10:1: tensor_parallel_size: 0 is not a positive multiple of the 1 node(s); fix: use 1 or another multiple of 1\n",
        ),
        (
            engine("  max_num_batched_tokens: 8\n  speculative: {method: dspark, tokens: 3}\n"),
            "error: K:10:3: engine.max_num_batched_tokens: 8 < max_num_seqs × (speculative tokens + 1) = 64; fix: raise it to at least 64\n",
        ),
        (
            engine("  port: 8000\n  master_port: 8000\n"),
            "error: K:11:3: engine.master_port: same as engine.port; fix: use a different port for the rendezvous\n",
        ),
        (
            format!("{HEAD}    fabric: {{ipv4: 10.0.0.1}}\n  - name: a\n    fabric: {{ipv4: 10.0.0.2}}\ntensor_parallel_size: 2\n{ENGINE}"),
            "error: K:8:5: nodes.1.name: duplicate node name `a`; fix: give every node a unique name\n",
        ),
        (
            format!("name: t\nmodel:\n  source: tiny-dense\nnodes:\n  - name: a\n{ENGINE}"),
            "error: K:4:1: nodes: no node has role head; fix: set role: head on exactly one node\n",
        ),
        (
            format!("{HEAD}    fabric: {{ipv4: 10.0.0.1}}\n  - name: b\n    role: head\n    fabric: {{ipv4: 10.0.0.2}}\ntensor_parallel_size: 2\n{ENGINE}"),
            "error: K:9:5: nodes.1.role: two heads (nodes.0, nodes.1); fix: set role: head on exactly one node and role: worker on the others\n",
        ),
        (
            "- just\n- a list\n".to_string(),
            "error: K:1:1: (top level): a kit must be a YAML mapping; fix: start the file with keys such as `name:` and `model:`\n",
        ),
        (
            format!("{HEAD}{ENGINE}  extra_args: [--a\n"),
            "error: K:11:1: YAML syntax error: while parsing a flow sequence, expected ',' or ']'\nhint: fix the YAML at that position (indentation, quotes, brackets)\n",
        ),
    ];
    for (body, want) in &cases {
        let (err, code) = bad_kit(body);
        assert_eq!(code, 2, "{body}\n{err}");
        assert_eq!(&err, want, "case:\n{body}");
    }
}

#[test]
fn bad_flags_and_env_name_their_source() {
    let o = spark(&["config", "--kit", "tiny-cpu", "--set", "engine.port"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "error: flag --set engine.port: engine.port: missing `=`; fix: write --set KEY=VALUE, e.g. --set engine.port=8888\n"
    );
    let o = spark(&["config", "--kit", "tiny-cpu"], &[("SPARK_KIT_ENGIN__PORT", "1")]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "error: env SPARK_KIT_ENGIN__PORT: engin.port: unknown key `engin`; fix: did you mean `engine`?\n"
    );
    let o = spark(&["config", "--kit", "no-such-kit"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).starts_with("error: no kit named `no-such-kit` and no such file; built-in kits: dgx-spark-2x-dsv41-exl3, dgx-spark-2x-dsv41-exl3-docker, tiny-cpu, tiny-cpu-2node, tiny-cpu-docker, tiny-cpu-docker-2node\nhint: "));
    let o = spark(&["config", "--no-such-flag"], &[]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn kits_lists_builtins_and_kit_show_prints_text() {
    let o = spark(&["kits", "--json"], &[]);
    assert!(o.status.success());
    let v: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = v.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "dgx-spark-2x-dsv41-exl3",
            "dgx-spark-2x-dsv41-exl3-docker",
            "tiny-cpu",
            "tiny-cpu-2node",
            "tiny-cpu-docker",
            "tiny-cpu-docker-2node"
        ]
    );
    let o = spark(&["kit", "show", "tiny-cpu"], &[]);
    let text = String::from_utf8(o.stdout).unwrap();
    assert_eq!(
        text,
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/launch-kits/tiny-cpu.yaml")).unwrap()
    );
}

#[test]
fn completions_and_version() {
    let o = spark(&["completions", "bash"], &[]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("spark-kit"));
    let o = spark(&["--version"], &[]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), format!("spark-kit {}", env!("CARGO_PKG_VERSION")));
}

/// Issue 21 item 7: byte sizes are shown as written (`12GiB`), not as 12884901888; the JSON keeps
/// the number of bytes and adds what was written.
#[test]
fn explain_shows_byte_sizes_as_written() {
    let o = spark(
        &["config", "--explain", "--kit", "dgx-spark-2x-dsv41-exl3", "--set", "memory.os_reserve=1.5GiB"],
        &[("SPARK_KIT_MEMORY__RUNTIME_OVERHEAD", "512MiB")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8(o.stdout).unwrap();
    let value = |key: &str| -> String {
        let line = table.lines().find(|l| l.split_whitespace().next() == Some(key)).unwrap_or_else(|| panic!("{key}"));
        line.split_whitespace().nth(1).unwrap().to_string()
    };
    assert_eq!(value("memory.boot_margin"), "12GiB", "{table}");
    assert_eq!(value("memory.os_reserve"), "1.5GiB");
    assert_eq!(value("memory.runtime_overhead"), "512MiB");
    // Written as a plain number in the kit file: shown in binary units.
    assert_eq!(value("engine.kv_cache_bytes"), "2.50GiB");
    assert!(!table.contains("12884901888"), "{table}");
    let rows = explain(&["--kit", "dgx-spark-2x-dsv41-exl3"], &[]);
    assert_eq!(row(&rows, "memory.boot_margin")["value"], 12_884_901_888u64);
    assert_eq!(row(&rows, "memory.boot_margin")["written"], "12GiB");
    assert!(row(&rows, "engine.port").get("written").is_none());
}

#[test]
fn the_spark_kits_name_a_released_vllm_and_refuse_floating_tags_and_unsupported_versions() {
    for kit in ["dgx-spark-2x-dsv41-exl3", "dgx-spark-2x-dsv41-exl3-docker"] {
        let o = spark(&["kit", "check", kit], &[]);
        assert!(o.status.success(), "{kit}: {}", stderr(&o));
    }
    let o = spark(&["plan", "--virtual"], &[]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        out.starts_with("engine: vLLM 0.34.0 (venv runtime, requirements engine-dgx-spark-cu130)"),
        "the default kit's plan names the released vLLM: {out}"
    );
    let o = spark(&["plan", "--virtual", "--kit", "dgx-spark-2x-dsv41-exl3-docker"], &[]);
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .starts_with("engine: vLLM 0.34.0 (docker runtime, image vllm/vllm-openai:v0.34.0-aarch64)"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let o = spark(
        &[
            "config",
            "--kit",
            "dgx-spark-2x-dsv41-exl3-docker",
            "--set",
            "engine.docker_image=vllm/vllm-openai:latest-aarch64",
            "--set",
            "engine.vllm_version=0.1.dev20904+g179dd0fa9",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("engine.docker_image: `vllm/vllm-openai:latest-aarch64` has a floating tag"), "{e}");
    assert!(
        e.contains("engine.vllm_version: 0.1.dev20904+g179dd0fa9 is not a vLLM release the overlay supports (0.32.0, 0.33.0, 0.34.0)"),
        "{e}"
    );
    // The venv kit's lock is for the Spark (aarch64, CPython 3.12): setup elsewhere says so.
    let o = spark(&["setup", "--kit", "dgx-spark-2x-dsv41-exl3"], &[]);
    if std::env::consts::ARCH != "aarch64" {
        assert_eq!(o.status.code(), Some(2));
        assert!(
            stderr(&o).contains("requirements set `engine-dgx-spark-cu130` is locked for Linux aarch64, CPython 3.12"),
            "{}",
            stderr(&o)
        );
    }
}

/// #28 item 4: a failure prints its whole cause chain through the binary: the error, then one
/// `caused by:` line per `#[source]` below it (`?` into `Failure` keeps the chain), then the hint.
#[test]
fn a_failure_prints_its_cause_chain() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("kit.yaml");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.to_str().unwrap();
    for cmd in [&["kit", "check", path][..], &["plan", "--kit", path][..]] {
        let out = spark(cmd, &[]);
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(
            stderr(&out),
            format!(
                "error: cannot read kit file {}\ncaused by: Is a directory (os error 21)\nhint: check the path and its permissions\n",
                dir.display()
            ),
            "{cmd:?}"
        );
    }
}
