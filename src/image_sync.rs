//! `spark-kit image sync`: make every node hold the head's `engine.docker_image`, by image id.
//! No registry: the head `docker save`s the image to a file in its cache (written under a
//! temporary name, checked, then renamed), the file goes to each worker that lacks the image
//! with the weights' rsync path (resumable: an interrupted copy continues), the worker
//! `docker load`s it, and the worker's image id must then equal the head's. `docker load` tags
//! the image only once every layer is in, so a worker never has a half-loaded image under the
//! name; the copied file is removed after a load that checks out. `save` and `load` are watched
//! by their daemon's heartbeat ([`heartbeat`]); every other call on a worker has 30 s.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bounded::{self, Ended};
use crate::cluster::push;
use crate::cluster::transport::{shell, shell_quote};
use crate::kit::schema::{Kit, Node, Role, Transport};
use crate::runtime::docker::dockerctl::{self, classify, DockerError};
use crate::runtime::docker::heartbeat;
use crate::weights::rsync;

/// Where progress goes.
pub trait SyncReporter {
    fn line(&self, text: &str);
}

/// What happened on one node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeSync {
    pub node: String,
    /// `present` (already the same id) or `copied`.
    pub action: &'static str,
    pub image_id: String,
}

/// Why a sync failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageSyncError {
    #[error("the kit has no engine.docker_image")]
    NoImageSet,
    #[error("on the head: {0}")]
    Head(DockerError),
    #[error("on node {node}: {error}")]
    Node { node: String, error: DockerError },
    #[error("cannot reach node {node}: {why}")]
    Reach { node: String, why: String },
    #[error("node {node} uses the exec transport; image sync copies over ssh")]
    Exec { node: String },
    #[error("docker save of {image} failed: {why}")]
    Save { image: String, why: String },
    #[error("copying the image to {node} failed: {why}")]
    Copy { node: String, why: String },
    #[error("after docker load, node {node} has image id {got}, the head has {want}")]
    Mismatch { node: String, got: String, want: String },
}

impl ImageSyncError {
    /// The one-line fix.
    #[must_use]
    pub fn fix(&self) -> String {
        match self {
            Self::NoImageSet => "set engine.docker_image in the kit".into(),
            Self::Head(e) | Self::Node { error: e, .. } => e.fix(),
            Self::Reach { .. } => "check ssh to the node (`spark-kit preflight` names what fails)".into(),
            Self::Exec { .. } => {
                "copy it yourself: `docker save IMAGE | <exec prefix> docker load`, or reach the node over ssh".into()
            }
            Self::Save { .. } => "check free disk space in the spark-kit cache (~/.cache/spark-kit/images)".into(),
            Self::Copy { .. } => "run `spark-kit image sync` again: the copy continues where it stopped".into(),
            Self::Mismatch { .. } => {
                "the node's docker rewrote the image (a different storage driver or docker version?); compare `docker image inspect` on both".into()
            }
        }
    }
}

/// The file name of a saved image: `<first 16 hex digits of its id>.tar` (content-addressed).
#[must_use]
pub fn file_stem(image_id: &str) -> String {
    let hex = image_id.strip_prefix("sha256:").unwrap_or(image_id);
    hex.chars().filter(char::is_ascii_hexdigit).take(16).collect()
}

/// Whether `tar -tf` output is that of a `docker save` archive.
#[must_use]
pub fn looks_saved(listing: &str) -> bool {
    listing.lines().any(|l| l.trim() == "manifest.json")
}

/// Sync every node of `kit` with the head's image. `exe`/`sha`: this binary (pushed to workers
/// for `__cache-capped`, as for the weights).
pub fn sync(
    kit: &Kit,
    cache: &Path,
    exe: &Path,
    sha: &str,
    rep: &dyn SyncReporter,
) -> Result<Vec<NodeSync>, ImageSyncError> {
    let image = crate::runtime::of(kit)
        .image(kit)
        .filter(|i| !i.is_empty())
        .map(str::to_string)
        .ok_or(ImageSyncError::NoImageSet)?;
    let want = dockerctl::image_id(&image)
        .map_err(ImageSyncError::Head)?
        .ok_or_else(|| ImageSyncError::Head(DockerError::NoImage(image.clone())))?;
    rep.line(&format!("head: {image} is {want}"));
    let mut out = Vec::new();
    let mut saved: Option<PathBuf> = None;
    for node in kit.nodes.iter() {
        if node.role == Role::Head || node.transport == Transport::Local {
            out.push(NodeSync { node: node.name.clone(), action: "present", image_id: want.clone() });
            continue;
        }
        if node.transport == Transport::Exec {
            return Err(ImageSyncError::Exec { node: node.name.clone() });
        }
        if remote_image_id(node, &image)?.as_deref() == Some(want.as_str()) {
            rep.line(&format!("{}: already has {want}", node.name));
            out.push(NodeSync { node: node.name.clone(), action: "present", image_id: want.clone() });
            continue;
        }
        let dir = match &saved {
            Some(d) => d.clone(),
            None => {
                let d = save(&image, &want, cache, rep)?;
                saved = Some(d.clone());
                d
            }
        };
        let remote = remote_cache(node)?;
        let remote_dir = format!("{remote}/images/{}", file_stem(&want));
        let bin = push::ensure(node, exe, sha)
            .map_err(|e| ImageSyncError::Reach { node: node.name.clone(), why: e.to_string() })?;
        let argv =
            rsync::argv(node, &dir, &remote_dir, &exe.to_string_lossy(), &bin, kit.model.sync_page_cache.bytes());
        rep.line(&format!("{}: copying the image ({}) to {remote_dir}", node.name, size_of(&dir)));
        rsync::run(node, &argv, &|l| rep.line(&format!("  {}: {l}", node.name)))
            .map_err(|e| ImageSyncError::Copy { node: node.name.clone(), why: e.to_string() })?;
        load(node, &format!("{remote_dir}/image.tar"), rep)?;
        let got = remote_image_id(node, &image)?.unwrap_or_default();
        if got != want {
            return Err(ImageSyncError::Mismatch { node: node.name.clone(), got, want });
        }
        // Loaded and checked: the copy is no longer needed there.
        let _ = on_node(node, &format!("rm -rf {}", shell_quote(&remote_dir)));
        rep.line(&format!("{}: loaded, image id {got}", node.name));
        out.push(NodeSync { node: node.name.clone(), action: "copied", image_id: got });
    }
    Ok(out)
}

fn size_of(dir: &Path) -> String {
    mib(std::fs::metadata(dir.join("image.tar")).map(|m| m.len()).unwrap_or(0))
}

fn mib(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let mib = bytes as f64 / f64::from(1u32 << 20);
    format!("{mib:.1} MiB")
}

/// `docker save` into `<cache>/images/<stem>/image.tar` unless a checked file is already there.
fn save(image: &str, id: &str, cache: &Path, rep: &dyn SyncReporter) -> Result<PathBuf, ImageSyncError> {
    let err = |why: String| ImageSyncError::Save { image: image.to_string(), why };
    let dir = cache.join("images").join(file_stem(id));
    let tar = dir.join("image.tar");
    if tar.is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
    let part = dir.join(".image.tar.part");
    rep.line(&format!("head: docker save {image} → {}", tar.display()));
    // By id: what is saved is what was compared, even if the tag moves meanwhile; the tag goes
    // along through `image`, so the worker's load names it.
    let still = &mut |t: Duration| {
        let written = std::fs::metadata(&part).map_or(0, |m| m.len());
        rep.line(&format!("head: docker save: still running, {} s, {} written", t.as_secs(), mib(written)));
    };
    dockerctl::long(&["save", "-o", &part.to_string_lossy(), image], Some(image), still)
        .map_err(|e| err(e.to_string()))?;
    // A full disk can truncate the archive with exit 0 (reference-kit.md E.9): list it.
    let listing = std::process::Command::new("tar")
        .arg("-tf")
        .arg(&part)
        .output()
        .map_err(|e| err(format!("cannot run tar to check the archive: {e}")))?;
    if !listing.status.success() || !looks_saved(&String::from_utf8_lossy(&listing.stdout)) {
        let _ = std::fs::remove_file(&part);
        return Err(err("the saved archive is incomplete (no manifest.json); disk full?".into()));
    }
    std::fs::rename(&part, &tar).map_err(|e| err(e.to_string()))?;
    std::fs::write(dir.join("image.id"), id).map_err(|e| err(e.to_string()))?;
    Ok(dir)
}

/// How long a short call on a node over ssh may take: the connection (ssh's own 10 s connect
/// limit) and, for a docker query, the daemon's answer.
const NODE_QUERY_LIMIT: Duration = Duration::from_secs(30);

/// `script` on `node` within [`NODE_QUERY_LIMIT`]: (exited 0, exit code, stdout, stderr), or
/// None when it did not end in time.
fn on_node(node: &Node, script: &str) -> Result<Option<(Option<i32>, String, String)>, ImageSyncError> {
    let reach = |e: std::io::Error| ImageSyncError::Reach { node: node.name.clone(), why: e.to_string() };
    Ok(match bounded::run(&mut shell(node, script), NODE_QUERY_LIMIT).map_err(reach)? {
        Ended::Exited { status, stdout, stderr } => Some((
            status.code(),
            String::from_utf8_lossy(&stdout).trim().to_string(),
            String::from_utf8_lossy(&stderr).into_owned(),
        )),
        Ended::Late { .. } | Ended::HeldOpen => None,
    })
}

/// The node's spark-kit cache directory (`SPARK_KIT_CACHE`, else `~/.cache/spark-kit`).
fn remote_cache(node: &Node) -> Result<String, ImageSyncError> {
    let reach = |why: String| ImageSyncError::Reach { node: node.name.clone(), why };
    match on_node(node, "printf %s \"${SPARK_KIT_CACHE:-$HOME/.cache/spark-kit}\"")? {
        Some((Some(0), path, _)) if !path.is_empty() => Ok(path),
        Some((_, _, stderr)) => Err(reach(stderr.lines().next().unwrap_or("no answer").to_string())),
        None => Err(reach(format!("no answer within {} s", NODE_QUERY_LIMIT.as_secs()))),
    }
}

/// The image id on `node`, None when the image is not there.
fn remote_image_id(node: &Node, image: &str) -> Result<Option<String>, ImageSyncError> {
    let script = format!("docker image inspect --format '{{{{.Id}}}}' {}", shell_quote(image));
    let fail = |error| Err(ImageSyncError::Node { node: node.name.clone(), error });
    match on_node(node, &script)? {
        Some((Some(0), id, _)) => Ok(Some(id)),
        Some((Some(127), _, _)) => fail(DockerError::NotInstalled),
        Some((_, _, stderr)) => match classify("image inspect", &stderr, Some(image)) {
            DockerError::NoImage(_) => Ok(None),
            error => fail(error),
        },
        None => fail(DockerError::NoAnswer { what: "image inspect".into(), secs: NODE_QUERY_LIMIT.as_secs() }),
    }
}

/// Whether the node's daemon answers (`docker version`), within [`NODE_QUERY_LIMIT`].
fn remote_alive(node: &Node) -> Result<(), DockerError> {
    match on_node(node, "docker version --format '{{.Server.Version}}'") {
        Ok(Some((Some(0), _, _))) => Ok(()),
        Ok(Some((_, _, stderr))) => Err(classify("version", &stderr, None)),
        Ok(None) => Err(DockerError::NoAnswer { what: "version".into(), secs: NODE_QUERY_LIMIT.as_secs() }),
        Err(e) => Err(DockerError::Failed { what: "version".into(), why: e.to_string() }),
    }
}

/// `docker load` on the node, watched by that daemon's heartbeat.
fn load(node: &Node, file: &str, rep: &dyn SyncReporter) -> Result<(), ImageSyncError> {
    let mut cmd = shell(node, &format!("docker load -q -i {}", shell_quote(file)));
    let still = &mut |t: Duration| rep.line(&format!("{}: docker load: still running, {} s", node.name, t.as_secs()));
    heartbeat::watched(&mut cmd, "load", None, heartbeat::LONG_CALLS, &mut || remote_alive(node), still)
        .map(drop)
        .map_err(|error| ImageSyncError::Node { node: node.name.clone(), error })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_files_are_named_by_image_id() {
        assert_eq!(
            file_stem("sha256:62d68dee0229b98c0f560677b0ded94ddc0f860a6d6123b7b3ea461b1a698bdd"),
            "62d68dee0229b98c"
        );
        assert_eq!(file_stem("../x"), "");
        assert!(looks_saved("blobs/\nmanifest.json\nrepositories\n"));
        assert!(!looks_saved("abc/layer.tar\n"));
    }
}
