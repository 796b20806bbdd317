//! Preflight reads the vLLM inside a docker kit's image, on a real Docker daemon started by the
//! test, with images made by `docker import` that carry a vLLM distribution's metadata: the
//! 0909 image's dev build fails preflight (and `up` before it syncs or starts anything) naming the
//! version found, the supported set and a docker fix (never `spark-kit setup`); the version is
//! read once per image id (cached); the image id is recorded in `spark-kit.lock` by the first
//! passing preflight and a different image under the same tag then fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use crate::common;

use std::path::{Path, PathBuf};

use common::{docker, free_port, spark_kit};

fn skip(test: &str) -> bool {
    if let Some(why) = docker::unavailable() {
        eprintln!("SKIP {test}: {why}");
        return true;
    }
    false
}

/// tiny-cpu-docker running the image's own vLLM (no venv mounted), pinned to vLLM 0.34.0, its
/// lock under `dir`.
fn kit_file(dir: &Path, name: &str, image: &str) -> PathBuf {
    let base = std::fs::read_to_string("launch-kits/tiny-cpu-docker.yaml").unwrap();
    let port = free_port();
    let text = base
        .replace(
            "  docker_image: spark-kit/tiny-cpu-engine:local\n",
            &format!("  docker_image: {image}\n  vllm_version: 0.34.0\n"),
        )
        .replace("  docker_mount_venv: true\n", "")
        .replace("name: tiny-cpu-docker", &format!("name: {name}"))
        .replace("  port: 8000\n", &format!("  port: {port}\n  internal_port: {}\n", free_port()))
        + &format!("paths:\n  data_dir: {}\n", dir.join("data").display());
    let p = dir.join("kit.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

/// One test's image (imported on the shared daemon), kit file and cache.
struct Case {
    d: &'static docker::Daemon,
    image: &'static str,
    id: String,
    dir: tempfile::TempDir,
    kit: PathBuf,
}

impl Case {
    fn new(made: &docker::TestImage, image: &'static str, kit_name: &str) -> Self {
        let d = docker::daemon().unwrap();
        let id = d.import(made, image, None);
        let dir = tempfile::tempdir().unwrap();
        let kit = kit_file(dir.path(), kit_name, image);
        Self { d, image, id, dir, kit }
    }

    fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// `spark-kit <args> --kit <kit>` against the test daemon: exit code, stdout + stderr.
    fn run(&self, args: &[&str]) -> (Option<i32>, String) {
        let out = spark_kit()
            .env("DOCKER_HOST", &self.d.host)
            .env("SPARK_KIT_CACHE", self.cache())
            .args(args)
            .arg("--kit")
            .arg(&self.kit)
            .output()
            .unwrap();
        (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

#[test]
fn the_dev_image_fails_preflight_and_up_before_anything_starts() {
    if skip("the_dev_image_fails_preflight") {
        return;
    }
    let c = Case::new(&docker::VLLM_DEV, "spark-kit-test/vllm-dev:1", "vllm-dev-test");
    let (image, id) = (c.image, &c.id);
    let (code, text) = c.run(&["preflight"]);
    assert_ne!(code, Some(0), "{text}");
    let short = &id.trim_start_matches("sha256:")[..12];
    let want = format!(
        "vLLM 0.1.dev20904+g179dd0fa9 in image {image} ({short}) is not a release the overlay supports (0.32.0, 0.33.0, 0.34.0); the kit pins 0.34.0"
    );
    let line = text.lines().find(|l| l.contains(" vllm ")).unwrap_or_else(|| panic!("no vllm check:\n{text}"));
    assert!(line.contains("FAIL") && line.contains(&want), "{line}");
    assert!(text.contains("fix: set engine.docker_image to an image of vLLM 0.34.0 (the official one: vllm/vllm-openai:v0.34.0-aarch64) and `docker pull` it on every node"), "{text}");
    assert!(!text.contains("spark-kit setup"), "a docker user is never told to run setup:\n{text}");

    // Read once per image id: the node keeps it under <cache>/image-vllm/<id>, and later
    // preflights take it from there (a changed entry shows through).
    let cached = c.cache().join("image-vllm").join(id.trim_start_matches("sha256:"));
    assert_eq!(std::fs::read_to_string(&cached).unwrap(), "0.1.dev20904+g179dd0fa9");
    std::fs::write(&cached, "0.33.0").unwrap();
    let (_, text) = c.run(&["preflight"]);
    assert!(text.contains(&format!("vLLM 0.33.0 in image {image} ({short}); the kit pins 0.34.0")), "{text}");
    std::fs::remove_file(&cached).unwrap();

    // `up` stops at the same check, before anything is synced or started.
    let (code, text) = c.run(&["up"]);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("==> engine: vLLM 0.34.0 (docker runtime, image spark-kit-test/vllm-dev:1)"), "{text}");
    assert!(text.contains(&want), "{text}");
    assert!(!text.contains("==> weights"), "nothing synced:\n{text}");
    // (The other test's `docker run --rm` probes may come and go on the shared daemon.)
    let ours = c.d.ok(&["ps", "-a", "--filter", "label=spark-kit.kit=vllm-dev-test", "--format", "{{.Names}}"]);
    assert!(ours.trim().is_empty(), "no container of the kit started: {ours}");
}

#[test]
fn the_first_passing_preflight_records_the_image_id_and_a_changed_image_then_fails() {
    if skip("the_first_passing_preflight_records") {
        return;
    }
    let c = Case::new(&docker::VLLM_RELEASE, "spark-kit-test/vllm-release:1", "vllm-image-test");
    let (image, id) = (c.image, c.id.clone());
    let (code, text) = c.run(&["preflight"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("vLLM 0.34.0 in image {image}")), "{text}");
    let lock_path = c.dir.path().join("data/vllm-image-test/spark-kit.lock");
    assert!(text.contains(&format!("recorded image {image} = {id} in {}", lock_path.display())), "{text}");
    let lock: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&lock_path).unwrap()).unwrap();
    assert_eq!(lock["images"][0]["id"], id.as_str());
    assert_eq!(lock["images"][0]["vllm_version"], "0.34.0");

    // The same tag now names another image (same files, another id).
    let other = c.d.import(&docker::VLLM_RELEASE, image, Some("moved"));
    assert_ne!(other, id);
    let (code, text) = c.run(&["preflight"]);
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains(&format!("image {image} on local is {other}, but {} recorded {id} for it", lock_path.display())),
        "{text}"
    );
}
