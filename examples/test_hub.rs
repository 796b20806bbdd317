//! The test Hub on its own: the fake Hugging Face Hub of `tests/fake_hub` — Hub API and
//! `resolve` (with `X-Xet-Hash` and the `xet-auth` link), the bridge origin, and xet-core's local
//! CAS behind its token-checking proxy — serving one model repo, until killed.
//!
//!   cargo run --example test_hub -- [DIR] [--repo ORG/NAME] [--rate BYTES_PER_S]
//!                                        [--no-xet] [--bridge URL] [--endpoint-file PATH]
//!
//! DIR's files (recursively) become the repo's files: `*.json`, `*.txt`, `*.md` and other files
//! under 1 MiB are regular git files, the rest LFS files, put into the CAS by hf-xet's upload
//! path. Without DIR it serves a small generated repo. `--bridge URL` sends `resolve`'s
//! redirects to another server's `/xet-bridge/<sha256>` (bench/download.sh: nginx). Prints
//! `HF_ENDPOINT=…`; point `spark-kit download` or `hf download` at it with that variable.
//! docs/download.md.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, clippy::print_stderr)]

#[path = "../tests/fake_hub"]
#[allow(dead_code, unused_imports)]
mod fake_hub {
    mod cas;
    mod cdn;
    pub mod model;
    pub mod serve;
    mod xet;
}

use std::path::{Path, PathBuf};

use fake_hub::model::{seeded_bytes, FakeFile};
use fake_hub::serve::FakeHub;

struct Args {
    dir: Option<PathBuf>,
    repo: String,
    rate: u64,
    xet: bool,
    endpoint_file: Option<PathBuf>,
    bridge: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut a =
        Args { dir: None, repo: "test-org/test-model".into(), rate: 0, xet: true, endpoint_file: None, bridge: None };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--repo" => a.repo = value("--repo")?,
            "--rate" => a.rate = value("--rate")?.parse().map_err(|_| "--rate takes bytes per second")?,
            "--no-xet" => a.xet = false,
            "--bridge" => a.bridge = Some(value("--bridge")?),
            "--endpoint-file" => a.endpoint_file = Some(value("--endpoint-file")?.into()),
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') => return Err(format!("unknown flag {s}")),
            s => a.dir = Some(s.into()),
        }
    }
    Ok(a)
}

fn sha256_file(p: &Path) -> String {
    spark_kit::hub::hashing::sha256_file(&std::fs::File::open(p).unwrap(), |_| {}).unwrap().0
}

fn walk(base: &Path, d: &Path, out: &mut Vec<FakeFile>) {
    let mut entries: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(base, &p, out);
            continue;
        }
        let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
        let size = std::fs::metadata(&p).unwrap().len();
        let text = [".json", ".txt", ".md", ".py"].iter().any(|e| rel.ends_with(e));
        if text || size < (1 << 20) {
            out.push(FakeFile::bytes(&rel, std::fs::read(&p).unwrap(), false));
        } else {
            let sha = sha256_file(&p);
            out.push(FakeFile::disk(&rel, p, size, &sha));
        }
    }
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprintln!("usage: cargo run --example test_hub -- [DIR] [--repo ORG/NAME] [--rate BYTES_PER_S] [--no-xet] [--bridge URL] [--endpoint-file PATH]");
            std::process::exit(2);
        }
    };
    let files = match &a.dir {
        Some(d) => {
            let mut v = Vec::new();
            walk(d, d, &mut v);
            v
        }
        None => vec![
            FakeFile::bytes("config.json", br#"{"model_type": "llama", "hidden_size": 64}"#.to_vec(), false),
            FakeFile::bytes("model-00001-of-00002.safetensors", seeded_bytes("shard-1", 8 << 20), true),
            FakeFile::bytes("model-00002-of-00002.safetensors", seeded_bytes("shard-2", (5 << 20) + 7), true),
        ],
    };
    let hub = FakeHub::start();
    hub.set_page_size(1000);
    hub.set_rate(a.rate);
    if let Some(b) = &a.bridge {
        hub.set_bridge(b);
    }
    let n = files.len();
    let commit = if a.xet { hub.push_xet(&a.repo, "main", files) } else { hub.push(&a.repo, "main", files) };
    println!("HF_ENDPOINT={}", hub.endpoint);
    println!(
        "repo {} at main = {commit}: {n} files; bridge {}; CAS {}",
        a.repo,
        hub.cdn,
        if a.xet { hub.cas.as_str() } else { "off" }
    );
    if let Some(p) = &a.endpoint_file {
        let tmp = p.with_extension("tmp");
        std::fs::write(&tmp, &hub.endpoint).unwrap();
        std::fs::rename(&tmp, p).unwrap();
    }
    loop {
        std::thread::park();
    }
}
