//! The engine's `docker run` command (src/runtime/docker/run.rs) run as built on a real daemon
//! (tests/common/docker.rs) for the tiny-cpu-docker kit: the daemon accepts every flag, the
//! container carries the name and labels of deployment, node and rank, the weights and the
//! overlay are mounted read-only, the overlay is on PYTHONPATH, oom_score_adj is 1000 and the
//! image's `vllm serve` gets the kit's arguments with the model at /model. Preflight, and
//! `status` with nothing running, then name the container as a survivor of this deployment (with no
//! `--kit`, of its kit).
//! The image is the test base image plus a `vllm` stand-in that prints its argv (made with
//! `docker commit`, offline).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::common;

use std::time::{Duration, Instant};

use common::{docker, spark_kit};
use spark_kit::engine::argv;
use spark_kit::runtime::docker::run as engine_docker;

const VLLM: &str = "import os\nos.makedirs('/usr/local/bin', exist_ok=True)\nopen('/usr/local/bin/vllm', 'w').write('#!/usr/bin/python3\\nimport os, sys, time\\nprint(\"vllm\", *sys.argv[1:], flush=True)\\nprint(\"PYTHONPATH=\" + os.environ.get(\"PYTHONPATH\", \"\"), flush=True)\\ntime.sleep(600)\\n')\nos.chmod('/usr/local/bin/vllm', 0o755)\n";

static IMAGE: std::sync::Once = std::sync::Once::new();

/// The daemon, with `spark-kit/tiny-cpu-engine:local` = base image + the `vllm` stand-in.
fn engine_image() -> &'static docker::Daemon {
    let d = docker::daemon().unwrap();
    IMAGE.call_once(|| {
        d.import(&docker::BASE, "spark-kit-test/base:1", None);
        let maker = d.ok(&["run", "-d", "spark-kit-test/base:1", "python3", "-c", VLLM]);
        d.ok(&["wait", &maker]);
        d.ok(&["commit", &maker, "spark-kit/tiny-cpu-engine:local"]);
        d.ok(&["rm", "-f", &maker]);
    });
    d
}

#[test]
fn the_engine_container_logs_tagged_lines_and_stops_to_nothing() {
    if let Some(why) = docker::unavailable() {
        eprintln!("SKIP the_engine_container_logs_tagged_lines: {why}");
        return;
    }
    let d = engine_image();
    let mut kit =
        spark_kit::kit::resolve(spark_kit::kit::source(Some("tiny-cpu-docker")).unwrap(), &[], &[]).unwrap().kit;
    kit.name = "launch-test".into();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir_all(&model).unwrap();
    let spec = argv::build(&kit, 0, &model.to_string_lossy(), &model.to_string_lossy());
    let mounts = engine_docker::Mounts {
        model: model.display().to_string(),
        engram: None,
        engram_packed: None,
        overlay: model.display().to_string(),
        caches: vec![],
        venv: None,
        same_path: vec![],
        pass_env: vec![],
    };
    let run = engine_docker::run_argv(&kit, 0, &spec, &mounts);
    let log = dir.path().join("engine.log");
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let l2 = std::sync::Arc::clone(&lines);
    let sink: spark_kit::engine::process::LineSink =
        std::sync::Arc::new(move |l: &str| l2.lock().unwrap().push(l.to_string()));
    let env: Vec<(String, String)> =
        vec![("DOCKER_HOST".into(), d.host.clone()), ("PATH".into(), std::env::var("PATH").unwrap())];
    let mut engine =
        spark_kit::runtime::docker::container::launch(&run, &env, log.clone(), "local/r0".into(), Some(sink)).unwrap();
    let name = engine_docker::container_name(&kit, 0);
    let until = Instant::now() + Duration::from_secs(30);
    while !lines.lock().unwrap().iter().any(|l| l.starts_with("vllm serve /model")) {
        assert!(Instant::now() < until, "no engine line reached the sink: {:?}", lines.lock().unwrap());
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.lines().any(|l| l.contains("local/r0 out") && l.contains("vllm serve /model")), "{text}");
    assert!(engine.try_wait().is_none(), "the docker client runs as long as the container");
    std::env::set_var("DOCKER_HOST", &d.host);
    // What the memory guard follows: the container's id and its main process on the host.
    let r = spark_kit::runtime::docker::container::engine_ref(&name).unwrap().expect("running");
    let spark_kit::memguard::EngineRef::Container { id, pid } = r else { panic!("{r:?}") };
    assert_eq!(id.as_str(), d.ok(&["inspect", "--format", "{{.Id}}", &name]));
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cg.contains(id.as_str()), "the main pid is in the container's cgroup: {cg}");
    let t = Instant::now();
    spark_kit::runtime::docker::container::stop(&name, kit.engine.shutdown_timeout_s).unwrap();
    eprintln!("docker stop + rm: {:.2} s", t.elapsed().as_secs_f64());
    let until = Instant::now() + Duration::from_secs(10);
    while engine.try_wait().is_none() {
        assert!(Instant::now() < until, "the docker client did not exit with its container");
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = d.ok(&["ps", "-aq", "--filter", "label=spark-kit.kit=launch-test"]);
    assert!(left.is_empty(), "containers left: {left}");
    // A survivor started by hand is removed by label.
    let mut by_hand = run.clone();
    by_hand.insert(2, "--detach".into());
    let refs: Vec<&str> = by_hand[1..].iter().map(String::as_str).collect();
    d.ok(&refs);
    // With nothing running, `status` names it, and the fix.
    let kit_file = dir.path().join("launch-test.yaml");
    let yaml = std::fs::read_to_string("launch-kits/tiny-cpu-docker.yaml").unwrap();
    std::fs::write(&kit_file, yaml.replace("name: tiny-cpu-docker", "name: launch-test")).unwrap();
    let out = spark_kit()
        .env("DOCKER_HOST", &d.host)
        .args(["status", "--kit"])
        .arg(&kit_file)
        .args(["--set", &format!("paths.logs={}", dir.path().display())])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let id = d.ok(&["inspect", "--format", "{{.Id}}", &name]);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("from an earlier run on this node: {name} ({}, running)", &id[..12])), "{err}");
    let up = format!("spark-kit up --kit {} --replace", spark_kit::hints::shell_quote(&kit_file.to_string_lossy()));
    let fix = format!(
        "start over them with `{up}` (it removes them first), or only remove them: `docker rm -f {name}` on this node"
    );
    assert!(err.contains(&fix), "{err}");
    // With no --kit (and no deployment in this cache), every kit's containers are named, each with its kit.
    let cache = dir.path().join("cache");
    let out = spark_kit().env("DOCKER_HOST", &d.host).env("SPARK_KIT_CACHE", &cache).arg("status").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no spark-kit deployment is running here; containers from an earlier run on this node: "),
        "{err}"
    );
    assert!(err.contains(&format!("{name} (kit launch-test, {}, running)", &id[..12])), "{err}");
    // A kit file's path is not on the container: only the removal by hand is named, and it names this one.
    let hint = err.lines().find(|l| l.contains("remove them: `docker rm -f ")).unwrap_or_else(|| panic!("{err}"));
    assert!(!hint.contains("--replace") && hint.contains(&name), "{err}");
    let removed = spark_kit::runtime::docker::container::remove_deployment("launch-test").unwrap();
    assert_eq!(removed, [name]);
    let left = d.ok(&[
        "ps",
        "-a",
        "--format",
        "{{.ID}} {{.Names}} {{.Status}}",
        "--filter",
        "label=spark-kit.kit=launch-test",
    ]);
    assert!(left.is_empty(), "left after remove_deployment: {left}");
}

#[test]
fn the_engine_run_command_runs_on_a_real_daemon_and_preflight_names_the_survivor() {
    if let Some(why) = docker::unavailable() {
        eprintln!("SKIP the_engine_run_command_runs_on_a_real_daemon: {why}");
        return;
    }
    let d = engine_image();

    let kit = spark_kit::kit::resolve(spark_kit::kit::source(Some("tiny-cpu-docker")).unwrap(), &[], &[]).unwrap().kit;
    let dir = tempfile::tempdir().unwrap();
    let (model, overlay, cache) = (dir.path().join("model"), dir.path().join("overlay"), dir.path().join("vllm-cache"));
    for p in [&model, &overlay, &cache] {
        std::fs::create_dir_all(p).unwrap();
    }
    let spec = argv::build(&kit, 0, &model.to_string_lossy(), &overlay.to_string_lossy());
    let mounts = engine_docker::Mounts {
        model: model.display().to_string(),
        engram: None,
        engram_packed: None,
        overlay: overlay.display().to_string(),
        caches: vec![(cache.display().to_string(), "/root/.cache/vllm".into())],
        venv: None,
        same_path: vec![],
        pass_env: vec![],
    };
    let mut a = engine_docker::run_argv(&kit, 0, &spec, &mounts);
    assert_eq!(a[..2], ["docker", "run"]);
    a.insert(2, "--detach".into());
    let t = Instant::now();
    let refs: Vec<&str> = a[1..].iter().map(String::as_str).collect();
    let id = d.ok(&refs);
    eprintln!("docker run as built: container up in {:.2} s", t.elapsed().as_secs_f64());
    let name = engine_docker::container_name(&kit, 0);
    assert_eq!(name, "spark-kit-tiny-cpu-docker-local-r0");

    let until = Instant::now() + Duration::from_secs(30);
    let logs = loop {
        let l = d.ok(&["logs", &name]);
        if l.contains("PYTHONPATH=") || Instant::now() > until {
            break l;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(logs.contains("vllm serve /model --served-model-name tiny-llama"), "{logs}");
    assert!(logs.contains("PYTHONPATH=/opt/spark-overlay"), "{logs}");

    let fmt = "{{index .Config.Labels \"spark-kit.kit\"}} {{index .Config.Labels \"spark-kit.node\"}} {{index .Config.Labels \"spark-kit.rank\"}} {{.HostConfig.NetworkMode}} {{.HostConfig.OomScoreAdj}}";
    assert_eq!(d.ok(&["inspect", "--format", fmt, &name]), "tiny-cpu-docker local 0 host 1000");
    let mounts = d.ok(&["inspect", "--format", "{{range .Mounts}}{{.Destination}}:{{.RW}} {{end}}", &name]);
    for m in ["/model:false", "/opt/spark-overlay:false", "/root/.cache/vllm:true"] {
        assert!(mounts.contains(m), "{m} in {mounts}");
    }

    // A survivor of this deployment: preflight names it and says what to do.
    let out = spark_kit().env("DOCKER_HOST", &d.host).args(["preflight", "--kit", "tiny-cpu-docker"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_ne!(out.status.code(), Some(0));
    let line = text.lines().find(|l| l.contains("containers")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("FAIL") && line.contains(&name) && line.contains(&id[..12]), "{line}");
    assert!(
        text.contains(&format!(
            "start over them with `spark-kit up --kit tiny-cpu-docker --replace` (it removes them first), or only \
             remove them: `docker rm -f {name}` on local"
        )),
        "{text}"
    );

    d.ok(&["stop", "-t", &kit.engine.shutdown_timeout_s.to_string(), &name]);
    let _ = d.docker(&["rm", "-f", &name]);
    // `--rm`: the daemon removes the stopped container itself, a moment later.
    let until = Instant::now() + Duration::from_secs(10);
    let left = loop {
        let left = d.ok(&["ps", "-aq", "--filter", "label=spark-kit.kit=tiny-cpu-docker"]);
        if left.is_empty() || Instant::now() > until {
            break left;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(left.is_empty(), "containers left: {left}");
}

/// The Spark kit's resource limits (`--ulimit` of its `docker run`: stack, memlock, nofile) as
/// the daemon records them: `docker create` parses and stores them (this VM has no GPU to start
/// it, and raising a limit past the daemon's own hard limit fails here at start, which is why
/// CPU kits carry only the stack one).
#[test]
fn the_spark_kits_ulimits_are_what_the_daemon_records() {
    if let Some(why) = docker::unavailable() {
        eprintln!("SKIP the_spark_kits_ulimits: {why}");
        return;
    }
    let d = engine_image();
    let kit = spark_kit::kit::resolve(spark_kit::kit::source(Some("dgx-spark-2x-dsv41-exl3")).unwrap(), &[], &[])
        .unwrap()
        .kit;
    let spec = argv::build(&kit, 0, "/m", "/o");
    let mounts = engine_docker::Mounts {
        model: "/m".into(),
        engram: None,
        engram_packed: None,
        overlay: "/o".into(),
        caches: vec![],
        venv: None,
        same_path: vec![],
        pass_env: vec![],
    };
    let run = engine_docker::run_argv(&kit, 0, &spec, &mounts);
    let limits: Vec<&str> = run.iter().map(String::as_str).filter(|a| a.starts_with("--ulimit=")).collect();
    assert!(limits.contains(&engine_docker::NOFILE), "{run:?}");
    let name = format!("ulimits-{}", std::process::id());
    let mut create = vec!["create", "--name", &name];
    create.extend(&limits);
    create.extend(["spark-kit/tiny-cpu-engine:local", "/bin/true"]);
    d.ok(&create);
    let got =
        d.ok(&["inspect", "--format", "{{range .HostConfig.Ulimits}}{{.Name}}={{.Soft}}:{{.Hard}} {{end}}", &name]);
    d.ok(&["rm", "-f", &name]);
    let mut got: Vec<&str> = got.split_whitespace().collect();
    got.sort_unstable();
    assert_eq!(got, ["memlock=-1:-1", "nofile=65536:65536", "stack=67108864:67108864"]);
}

/// The real docker client waits forever on a daemon that accepts and never answers (measured here: still
/// waiting after 40 s); spark-kit's queries of the daemon end within their limit: `status` says the
/// rest of what it knows, `guard --container` names the daemon and the fix.
#[test]
fn status_and_guard_do_not_hang_on_a_daemon_that_never_answers() {
    if std::process::Command::new("docker").arg("--version").output().is_err() {
        eprintln!(
            "SKIP status_and_guard_do_not_hang_on_a_daemon_that_never_answers: no `docker` client (apt-get install docker.io)"
        );
        return;
    }
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host = format!("tcp://{}", silent.local_addr().unwrap());
    let dir = tempfile::tempdir().unwrap();
    for kit in [None, Some("tiny-cpu-docker")] {
        let t = Instant::now();
        let mut cmd = spark_kit();
        cmd.env("DOCKER_HOST", &host).env("SPARK_KIT_CACHE", dir.path()).arg("status");
        if let Some(k) = kit {
            cmd.args(["--kit", k]);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let took = t.elapsed();
        assert_eq!(out.status.code(), Some(1), "{kit:?}: {err}");
        assert!(took < Duration::from_secs(25), "{kit:?}: {took:?}");
        assert!(err.contains("is running here") && !err.contains("from an earlier run"), "{kit:?}: {err}");
        eprintln!("status {kit:?} against a silent daemon: {:.1} s", took.as_secs_f64());
    }
    // The memory guard's container lookup is a query too: it fails, naming the daemon and the fix.
    let t = Instant::now();
    let out = spark_kit()
        .env("DOCKER_HOST", &host)
        .env("SPARK_KIT_CACHE", dir.path())
        .args(["guard", "--container", "engine-x"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(t.elapsed() < Duration::from_secs(25), "{:?}", t.elapsed());
    assert!(
        err.contains("--container engine-x: the Docker daemon did not answer `docker container inspect` within 10 s")
            && err.contains("sudo systemctl restart docker"),
        "{err}"
    );
    drop(silent);
}
