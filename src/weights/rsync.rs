//! `model.sync: rsync`: copy the head's weight tree to an ssh node with rsync — resumable (a
//! partial file waits in `.rsync-partial/`, never under its final name), only changed files
//! (size and mtime), and both ends run under `spark-kit __cache-capped` so the page cache the
//! copy leaves behind stays under `model.sync_page_cache` (on GB10 page cache is GPU memory).
//! Command construction is pure and unit-tested; running it streams rsync's per-file lines.
//! rsync runs in a process group of its own (with the ssh client and, over an `exec` transport,
//! the node's end), so the supervisor can stop the whole copy at once: SIGTERM makes rsync keep
//! a partial file in `.rsync-partial/` (never under its final name).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::cluster::transport::{shell_quote, ssh_base, ssh_target};
use crate::kit::schema::{Node, Transport};

/// Why a sync failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("cannot start rsync ({0}); install rsync on every node (Debian/Ubuntu: apt install rsync)")]
    Start(std::io::Error),
    #[error("rsync to {node} failed ({status}): {last}")]
    Failed { node: String, status: String, last: String },
}

/// The argument vector that copies `src/` to `dst/` on `node` (`dst` relative to the node's home
/// when it starts with `~/`). `local_bin` / `remote_bin` are spark-kit on each end.
#[must_use]
pub fn argv(node: &Node, src: &Path, dst: &str, local_bin: &str, remote_bin: &str, cap: u64) -> Vec<String> {
    let capped =
        |bin: &str| vec![bin.to_string(), "__cache-capped".into(), "--cap".into(), cap.to_string(), "--".into()];
    let mut v = capped(local_bin);
    v.extend(
        [
            "rsync",
            "-a",
            // A cache written by `hf` (shared blob store) links models--*/blobs/<etag> to
            // ../../blobs/<2hex>/<xet_hash>, outside the tree: copy what such a link points to
            // (a plain copy of the link would dangle on the node). Links inside stay links.
            "--copy-unsafe-links",
            "--mkpath",
            "--partial-dir=.rsync-partial",
            "--exclude=.rsync-partial/",
            "--exclude=*.partial",
            "--exclude=*.incomplete",
            "--out-format=synced %n (%l bytes)",
        ]
        .map(String::from),
    );
    v.push("-e".into());
    v.push(remote_shell(node).iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" "));
    v.push("--rsync-path".into());
    let mut remote = capped(remote_bin);
    remote.push("rsync".into());
    v.push(remote.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" "));
    v.push(format!("{}/", src.display()));
    // A remote path without a leading `/` is relative to the login's home directory.
    let dst = dst.strip_prefix("~/").unwrap_or(dst).trim_end_matches('/');
    let host = if node.transport == Transport::Ssh { ssh_target(node) } else { node.name.clone() };
    v.push(format!("{host}:{dst}/"));
    v
}

/// The remote shell rsync starts the node's end with: ssh, or the node's `exec` prefix running
/// `sh`, which (as ssh's login shell does) starts in the node's home and joins the command's
/// words (`$0` is the host word rsync puts first).
fn remote_shell(node: &Node) -> Vec<String> {
    match node.transport {
        Transport::Ssh => ssh_base(node),
        Transport::Exec | Transport::Local => {
            let mut v = node.exec_prefix.clone();
            v.extend(["sh".into(), "-c".into(), "cd && eval \"$*\"".into()]);
            v
        }
    }
}

/// Run the copy; each line rsync prints goes to `line`.
pub fn run(node: &Node, argv: &[String], line: &dyn Fn(&str)) -> Result<(), SyncError> {
    run_in_group(node, argv, line, &AtomicI32::new(0))
}

/// [`run`], in a process group of its own whose id is stored in `group` while it runs (0
/// before and after): signal it with `killpg` to stop the copy and everything it started.
pub fn run_in_group(node: &Node, argv: &[String], line: &dyn Fn(&str), group: &AtomicI32) -> Result<(), SyncError> {
    let (prog, args) = argv.split_first().ok_or_else(|| SyncError::Start(std::io::ErrorKind::InvalidInput.into()))?;
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(SyncError::Start)?;
    group.store(i32::try_from(child.id()).unwrap_or(0), Ordering::SeqCst);
    let err = child.stderr.take().map(|e| {
        std::thread::spawn(move || {
            let mut lines: Vec<String> = BufReader::new(e).lines().map_while(Result::ok).collect();
            lines.retain(|l| !l.trim().is_empty());
            lines
        })
    });
    if let Some(out) = child.stdout.take() {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            line(&l);
        }
    }
    let status = child.wait();
    group.store(0, Ordering::SeqCst);
    let status = status.map_err(SyncError::Start)?;
    let errs = err.and_then(|h| h.join().ok()).unwrap_or_default();
    for e in &errs {
        line(e);
    }
    if status.success() {
        Ok(())
    } else {
        Err(SyncError::Failed {
            node: node.name.clone(),
            status: status.to_string(),
            last: errs.last().cloned().unwrap_or_else(|| "no message".into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::schema::Transport;

    #[test]
    fn both_ends_are_capped_and_partials_stay_aside() {
        let node = Node {
            name: "b".into(),
            transport: Transport::Ssh,
            ssh_host: Some("10.0.0.2".into()),
            ssh_user: Some("me".into()),
            ssh_port: 2222,
            ssh_options: vec!["-o".into(), "IdentityFile=/k/id x".into()],
            ..Node::default()
        };
        let v = argv(&node, Path::new("/w/models--o--n"), "~/.cache/hf/models--o--n", "/bin/sk", "/r/sk", 1 << 30);
        assert_eq!(&v[..6], &["/bin/sk", "__cache-capped", "--cap", "1073741824", "--", "rsync"]);
        assert!(v.contains(&"--copy-unsafe-links".to_string()), "{v:?}");
        assert!(v.contains(&"--partial-dir=.rsync-partial".to_string()));
        let e = &v[v.iter().position(|a| a == "-e").unwrap() + 1];
        assert!(
            e.starts_with("ssh -o BatchMode=yes") && e.contains("-p 2222") && e.ends_with("'IdentityFile=/k/id x'"),
            "{e}"
        );
        let r = &v[v.iter().position(|a| a == "--rsync-path").unwrap() + 1];
        assert_eq!(r, "/r/sk __cache-capped --cap 1073741824 -- rsync");
        assert_eq!(v[v.len() - 2], "/w/models--o--n/");
        assert_eq!(v[v.len() - 1], "me@10.0.0.2:.cache/hf/models--o--n/");
        let abs = argv(&node, Path::new("/w/m"), "/models/m/", "/bin/sk", "/r/sk", 1);
        assert_eq!(abs[abs.len() - 1], "me@10.0.0.2:/models/m/");
        // Over an exec transport: the prefix runs the node's end from the node's home.
        let node = Node {
            name: "b".into(),
            transport: Transport::Exec,
            exec_prefix: vec!["ip".into(), "netns".into(), "exec".into(), "b".into()],
            ..Node::default()
        };
        let v = argv(&node, Path::new("/w/m"), "~/m", "/bin/sk", "/r/sk", 1);
        let e = &v[v.iter().position(|a| a == "-e").unwrap() + 1];
        assert_eq!(e, r#"ip netns exec b sh -c 'cd && eval "$*"'"#);
        assert_eq!(v[v.len() - 1], "b:m/");
    }
}
