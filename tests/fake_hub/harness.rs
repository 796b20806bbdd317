//! A temp dir, a fake Hub with a model repo (and optionally an Engram repo), a kit pointing at
//! both, and the spark-kit binary run against them with a clean environment.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::model::{seeded_bytes, FakeFile};
use super::serve::FakeHub;

pub const MODEL: &str = "test-org/tiny-model";
pub const ENGRAM: &str = "test-org/tiny-engram";

pub struct Setup {
    pub hub: FakeHub,
    pub dir: tempfile::TempDir,
    pub kit: PathBuf,
    pub commit: String,
}

/// The default model repo: three LFS shards of a few hundred KiB to ~1 MiB, a nested LFS file,
/// and regular config/tokenizer files.
pub fn model_files() -> Vec<FakeFile> {
    vec![
        FakeFile::bytes("config.json", br#"{"model_type": "llama", "hidden_size": 64}"#.to_vec(), false),
        FakeFile::bytes("tokenizer_config.json", b"{\"tokenizer_class\": \"X\"}\n".to_vec(), false),
        FakeFile::random("model-00001-of-00003.safetensors", 1 << 20),
        FakeFile::random("model-00002-of-00003.safetensors", (768 << 10) + 13),
        FakeFile::random("model-00003-of-00003.safetensors", 300_001),
        FakeFile::random("extra/nested.bin", 70_000),
    ]
}

/// The Engram repo: shards 47 and 48 with embed tensors in the index, plus a shard not fetched.
pub fn engram_files(embed_outside: bool) -> Vec<FakeFile> {
    let other = if embed_outside { "model-00001-of-00048.safetensors" } else { "model-00047-of-00048.safetensors" };
    let index = serde_json::json!({
        "metadata": {"total_size": 3},
        "weight_map": {
            "model.layers.1.engram.embed.weight": "model-00047-of-00048.safetensors",
            "model.layers.1.engram.embed.scale": other,
            "model.layers.14.engram.embed.weight": "model-00048-of-00048.safetensors",
            "model.layers.14.engram.embed.scale": "model-00048-of-00048.safetensors",
            "model.layers.14.engram.wkv.weight": "model-00048-of-00048.safetensors",
            "model.layers.2.mlp.weight": "model-00001-of-00048.safetensors"
        }
    });
    vec![
        FakeFile::bytes("config.json", b"{\"model_type\": \"deepseek\"}".to_vec(), false),
        FakeFile::bytes("model.safetensors.index.json", index.to_string().into_bytes(), false),
        FakeFile::random("model-00001-of-00048.safetensors", 200_000),
        FakeFile::random("model-00047-of-00048.safetensors", 400_000),
        FakeFile::random("model-00048-of-00048.safetensors", 300_000),
    ]
}

impl Setup {
    /// A fake Hub with the default model repo on `main`; `engram` adds the Engram repo.
    pub fn new(engram: Option<Vec<FakeFile>>) -> Self {
        Self::with_files(model_files(), engram)
    }

    pub fn with_files(model: Vec<FakeFile>, engram: Option<Vec<FakeFile>>) -> Self {
        Self::build(model, engram, false)
    }

    /// The default model repo with every LFS file also in the test Hub's Xet CAS.
    pub fn xet() -> Self {
        Self::build(model_files(), None, true)
    }

    /// `xet`: the LFS files are put into the CAS and announced as Xet-backed.
    pub fn build(model: Vec<FakeFile>, engram: Option<Vec<FakeFile>>, xet: bool) -> Self {
        let hub = FakeHub::start();
        let dir = tempfile::tempdir().unwrap();
        let shards = model.iter().filter(|f| f.path.ends_with(".safetensors")).count();
        let push =
            |repo: &str, files| if xet { hub.push_xet(repo, "main", files) } else { hub.push(repo, "main", files) };
        let commit = push(MODEL, model);
        let engram_yaml = if let Some(files) = engram {
            push(ENGRAM, files);
            format!(
                "engram:\n  repo: {ENGRAM}\n  revision: main\n  files:\n    - path: model-00047-of-00048.safetensors\n    - path: model-00048-of-00048.safetensors\n    - path: model.safetensors.index.json\n    - path: config.json\n  layers: [1, 14]\n"
            )
        } else {
            String::new()
        };
        let d = dir.path().display();
        let kit = dir.path().join("dl-test.yaml");
        std::fs::write(
            &kit,
            format!(
                "name: dl-test\ndescription: download test\nmodel:\n  source: hub\n  repo: {MODEL}\n  revision: main\n  expected_shards: {shards}\n  files:\n    - path: config.json\n{engram_yaml}nodes:\n  - name: local\n    role: head\n    transport: local\ntensor_parallel_size: 1\nengine:\n  requirements: engine-tiny-cpu\n  served_model_name: tiny\npaths:\n  hf_cache: {d}/hub\n  engram_dir: {d}/engram\n  data_dir: {d}/data\n"
            ),
        )
        .unwrap();
        Self { hub, dir, kit, commit }
    }

    /// Set `model.transport` in the kit (`auto`, `bridge`, `xet`).
    pub fn set_transport(&self, t: &str) {
        let kit = std::fs::read_to_string(&self.kit).unwrap();
        let kit = kit.replacen("  revision: main\n", &format!("  revision: main\n  transport: {t}\n"), 1);
        std::fs::write(&self.kit, kit).unwrap();
    }

    pub fn cache(&self) -> PathBuf {
        self.dir.path().join("hub")
    }

    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.cache().join(format!("models--{}", repo.replace('/', "--")))
    }

    pub fn lock_file(&self) -> PathBuf {
        self.dir.path().join("data/dl-test/spark-kit.lock")
    }

    /// spark-kit with a clean environment: HOME in the temp dir, HF_ENDPOINT at the fake Hub.
    /// The `TMPDIR` of the commands (hf-xet's working directories go there).
    pub fn tmp(&self) -> PathBuf {
        self.dir.path().join("tmp")
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_spark-kit"));
        std::fs::create_dir_all(self.tmp()).unwrap();
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .env("TMPDIR", self.tmp())
            .env("HF_ENDPOINT", &self.hub.endpoint)
            .args(args)
            .arg("--kit")
            .arg(&self.kit);
        c
    }

    /// `download --json` with small ranges and fast timeouts, plus `extra` flags.
    pub fn download(&self, extra: &[&str]) -> Output {
        let mut args = vec!["download", "--json", "--idle-timeout", "2"];
        if !extra.contains(&"--range-size") {
            args.extend_from_slice(&["--range-size", "128KiB"]);
        }
        if !extra.contains(&"--jobs") {
            args.extend_from_slice(&["--jobs", "4"]);
        }
        args.extend_from_slice(extra);
        self.cmd(&args).output().unwrap()
    }

    /// Like `download`, asserting success; returns the JSON summary.
    pub fn download_ok(&self, extra: &[&str]) -> serde_json::Value {
        let out = self.download(extra);
        assert!(
            out.status.success(),
            "download failed ({:?}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The bytes of `path` in the cached snapshot of `repo` at `commit`.
    pub fn cached(&self, repo: &str, commit: &str, path: &str) -> Vec<u8> {
        std::fs::read(self.repo_dir(repo).join("snapshots").join(commit).join(path)).unwrap()
    }

    /// Assert the model snapshot holds exactly the generated bytes of every file.
    pub fn assert_model_complete(&self) {
        for f in model_files() {
            let want = match f.content {
                super::model::Content::Mem(v) => v.to_vec(),
                super::model::Content::Disk(p) => std::fs::read(p).unwrap(),
            };
            assert_eq!(self.cached(MODEL, &self.commit, &f.path), want, "{}", f.path);
        }
    }
}

impl Setup {
    /// `(path → finished ranges)` from every resume journal in `repo`'s `blobs/`.
    pub fn journals(&self, repo: &str) -> std::collections::HashMap<String, Vec<(u64, u64)>> {
        let mut out = std::collections::HashMap::new();
        let Ok(rd) = std::fs::read_dir(self.repo_dir(repo).join("blobs")) else { return out };
        for e in rd.flatten() {
            if !e.file_name().to_string_lossy().ends_with(".spark-partial.json") {
                continue;
            }
            let Ok(text) = std::fs::read(e.path()) else { continue };
            let Ok(j) = serde_json::from_slice::<serde_json::Value>(&text) else { continue };
            let done: Vec<(u64, u64)> = j["done"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r[0].as_u64().unwrap(), r[1].as_u64().unwrap()))
                .collect();
            out.insert(j["path"].as_str().unwrap().to_string(), done);
        }
        out
    }
}

/// Every file under `dir` (recursively), relative.
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                walk(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Content of a seeded file, for assertions.
pub fn seeded(path: &str, len: usize) -> Vec<u8> {
    seeded_bytes(path, len)
}
