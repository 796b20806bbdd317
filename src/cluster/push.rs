//! The head pushes its own spark-kit binary to a node whose copy differs: content-addressed
//! (`~/.cache/spark-kit/bin/spark-kit-<sha12>`), written to a temporary name, checked with
//! sha256sum on the node, then renamed. No version skew, no half-written binary ever run.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use sha2::{Digest, Sha256};

use super::transport::shell;
use crate::hex::encode as hex;
use crate::kit::schema::{Node, Transport};

/// Why a push failed.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("cannot read the local binary {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("cannot reach node {node}: {why}")]
    Reach { node: String, why: String },
    #[error("pushing the binary to node {node} failed: {why}")]
    Failed { node: String, why: String },
}

/// SHA-256 of a file, hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(hex(&h.finalize()))
}

/// The node-side path (shell syntax) of the binary with hash `sha`.
#[must_use]
pub fn remote_path(sha: &str) -> String {
    format!("$HOME/.cache/spark-kit/bin/spark-kit-{}", &sha[..12])
}

/// Make sure `node` has this binary; returns the path to run there. Local nodes use `exe`.
pub fn ensure(node: &Node, exe: &Path, sha: &str) -> Result<String, PushError> {
    if node.transport == Transport::Local {
        return Ok(exe.to_string_lossy().into_owned());
    }
    let target = remote_path(sha);
    let check = format!("test -x \"{target}\" && sha256sum \"{target}\" | cut -d' ' -f1; echo \"$HOME\"");
    let out = shell(node, &check)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| PushError::Reach { node: node.name.clone(), why: e.to_string() })?;
    if !out.status.success() && out.stdout.is_empty() {
        return Err(PushError::Reach { node: node.name.clone(), why: one_line(&String::from_utf8_lossy(&out.stderr)) });
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines().collect::<Vec<_>>();
    let home = lines.pop().unwrap_or_default().to_string();
    let resolved = target.replace("$HOME", &home);
    if lines.first().is_some_and(|l| l.trim() == sha) {
        return Ok(resolved);
    }
    let script = format!(
        "set -e; d=\"$HOME/.cache/spark-kit/bin\"; mkdir -p \"$d\"; t=\"$d/.push.$$\"; cat > \"$t\"; chmod 755 \"$t\"; \
         s=$(sha256sum \"$t\" | cut -d' ' -f1); if [ \"$s\" = \"{sha}\" ]; then mv -f \"$t\" \"{target}\"; echo ok; \
         else rm -f \"$t\"; echo \"checksum $s\"; exit 3; fi"
    );
    let bytes = std::fs::read(exe).map_err(|e| PushError::Read { path: exe.display().to_string(), source: e })?;
    let mut child = shell(node, &script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| PushError::Reach { node: node.name.clone(), why: e.to_string() })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(&bytes).map_err(|e| PushError::Failed { node: node.name.clone(), why: e.to_string() })?;
    }
    let out =
        child.wait_with_output().map_err(|e| PushError::Failed { node: node.name.clone(), why: e.to_string() })?;
    if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok" {
        Ok(resolved)
    } else {
        Err(PushError::Failed {
            node: node.name.clone(),
            why: one_line(&format!(
                "{} {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )),
        })
    }
}

/// Command output as one line (errors are one line).
fn one_line(text: &str) -> String {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" | ")
}
