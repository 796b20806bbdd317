//! Build script: embeds the Python overlay (package, dist-info template, tools, requirement
//! sets) into the binary, and records where libpython lives so the engine can load it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const EMBED: &[&str] = &["spark_overlay", "spark_overlay.dist-info-template", "tools", "requirements"];

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name == "__pycache__" || name.ends_with(".pyc") || name.starts_with('.') {
            continue;
        }
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let overlay = root.join("python_overlay");
    let mut files = Vec::new();
    for d in EMBED {
        println!("cargo:rerun-if-changed=python_overlay/{d}");
        walk(&overlay.join(d), &mut files);
    }
    let mut code = String::from(
        "/// Overlay files: (path relative to python_overlay/, bytes).\npub static FILES: &[(&str, &[u8])] = &[\n",
    );
    for f in &files {
        let rel = f.strip_prefix(&overlay).unwrap_or(f).to_string_lossy().replace('\\', "/");
        let _ = writeln!(code, "    ({rel:?}, include_bytes!({:?})),", f.display().to_string());
        println!("cargo:rerun-if-changed={}", f.display());
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("overlay_files.rs");
    if let Err(e) = std::fs::write(&out, code) {
        panic!("cannot write {}: {e}", out.display());
    }

    // The engine embeds CPython through PyO3 (linked dynamically): record libpython's directory
    // as an rpath so the binary starts without LD_LIBRARY_PATH.
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    let facts = Command::new(&python)
        .args([
            "-c",
            "import sys, sysconfig, platform; print(sysconfig.get_config_var('LIBDIR') or ''); \
             print(getattr(sys, '_base_executable', sys.executable)); print(platform.python_version())",
        ])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect::<Vec<_>>())
        .unwrap_or_default();
    let get = |i: usize| facts.get(i).cloned().unwrap_or_default();
    if !get(0).is_empty() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", get(0));
    }
    // The engine venv is created from the same interpreter, so its libpython matches.
    println!("cargo:rustc-env=SPARKKIT_BUILD_PYTHON={}", if get(1).is_empty() { python.clone() } else { get(1) });
    println!("cargo:rustc-env=SPARKKIT_BUILD_PYTHON_VERSION={}", get(2));
}
