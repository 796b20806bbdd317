//! Where a node's raw facts come from: a [`ProbeSource`] reads files, lists directories and runs
//! commands *on that node*. [`LocalProbe`] is this machine; [`RecordedProbe`] replays a recorded
//! tree (tests, bug reports); the node agent plugs in a remote source for the worker.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::bounded::{self, Ended};

/// Why a probe got nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ProbeError {
    /// The file or command does not exist on the node.
    #[error("{0}: not found")]
    NotFound(String),
    /// It exists but failed (status and the first line of stderr).
    #[error("{what} failed: {why}")]
    Failed { what: String, why: String },
}

/// Raw access to one node.
pub trait ProbeSource {
    /// Read a file (an absolute path on the node, e.g. `/proc/meminfo`).
    fn read(&self, path: &str) -> Result<String, ProbeError>;
    /// Entry names of a directory, sorted.
    fn list(&self, path: &str) -> Result<Vec<String>, ProbeError>;
    /// Run a command; `name` identifies it in recordings (`nvidia-smi-gpu`). Its stdout.
    fn run(&self, name: &str, argv: &[&str]) -> Result<String, ProbeError>;
    /// [`ProbeSource::run`] for a command that may take up to `timeout_s` (the fabric all-reduce).
    fn run_long(&self, name: &str, argv: &[&str], _timeout_s: u64) -> Result<String, ProbeError> {
        self.run(name, argv)
    }
    /// Free bytes for an unprivileged user on the filesystem holding `path` (its nearest existing ancestor).
    fn free_bytes(&self, path: &str) -> Result<u64, ProbeError>;
    /// Whether a TCP listener can bind `host:port` now.
    fn port_free(&self, host: &str, port: u16) -> Result<bool, ProbeError>;
    /// The spark-kit version running there.
    fn spark_kit_version(&self) -> Result<String, ProbeError>;
    /// Keep `text` in the file `path` on the node: a cache, so a failure keeps nothing and says
    /// nothing (the default keeps nothing).
    fn remember(&self, _path: &str, _text: &str) {}
}

/// This machine.
#[derive(Debug, Clone, Default)]
pub struct LocalProbe {
    /// Seconds a command may take.
    pub timeout_s: u64,
}

impl ProbeSource for LocalProbe {
    fn read(&self, path: &str) -> Result<String, ProbeError> {
        std::fs::read_to_string(path).map_err(|e| io_error(path, &e))
    }

    fn list(&self, path: &str) -> Result<Vec<String>, ProbeError> {
        let dir = std::fs::read_dir(path).map_err(|e| io_error(path, &e))?;
        let mut v: Vec<String> = dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        Ok(v)
    }

    fn run(&self, name: &str, argv: &[&str]) -> Result<String, ProbeError> {
        let (prog, args) = argv.split_first().ok_or_else(|| ProbeError::NotFound(name.to_string()))?;
        let limit = Duration::from_secs(self.timeout_s.max(1));
        let ended =
            bounded::run(Command::new(prog).args(args).env("LC_ALL", "C"), limit).map_err(|e| io_error(prog, &e))?;
        let failed = |why: String| ProbeError::Failed { what: argv.join(" "), why };
        match ended {
            Ended::Late { .. } => Err(failed(format!("no answer within {} s", limit.as_secs()))),
            Ended::HeldOpen => Err(failed(format!(
                "it exited, but a process it started held its output open past {} s",
                limit.as_secs()
            ))),
            Ended::Exited { status, stdout, .. } if status.success() => {
                Ok(String::from_utf8_lossy(&stdout).into_owned())
            }
            Ended::Exited { status, stderr, .. } => {
                let err = String::from_utf8_lossy(&stderr);
                let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
                Err(failed(format!("{status}: {first}")))
            }
        }
    }

    fn run_long(&self, name: &str, argv: &[&str], timeout_s: u64) -> Result<String, ProbeError> {
        LocalProbe { timeout_s }.run(name, argv)
    }

    fn free_bytes(&self, path: &str) -> Result<u64, ProbeError> {
        let mut p = Path::new(path);
        while !p.exists() {
            p = p.parent().ok_or_else(|| ProbeError::NotFound(path.to_string()))?;
        }
        let s = nix::sys::statvfs::statvfs(p)
            .map_err(|e| ProbeError::Failed { what: format!("statvfs {}", p.display()), why: e.to_string() })?;
        Ok(s.blocks_available().saturating_mul(s.fragment_size()))
    }

    fn port_free(&self, host: &str, port: u16) -> Result<bool, ProbeError> {
        let addr = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        match TcpListener::bind(&addr) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Ok(false),
            Err(e) => Err(ProbeError::Failed { what: format!("bind {addr}"), why: e.to_string() }),
        }
    }

    fn spark_kit_version(&self) -> Result<String, ProbeError> {
        Ok(env!("CARGO_PKG_VERSION").to_string())
    }

    fn remember(&self, path: &str, text: &str) {
        let path = Path::new(path);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written = path.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|()| std::fs::write(&tmp, text));
        if written.and_then(|()| std::fs::rename(&tmp, path)).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

fn io_error(what: &str, e: &std::io::Error) -> ProbeError {
    if e.kind() == std::io::ErrorKind::NotFound {
        ProbeError::NotFound(what.to_string())
    } else {
        ProbeError::Failed { what: what.to_string(), why: e.to_string() }
    }
}

/// A recorded node: a directory holding the node's files under their absolute paths
/// (`proc/meminfo`, `sys/class/net/…`), command outputs as `cmd/<name>` (a `cmd/<name>.fail`
/// file instead means the command failed with that text), and `probe/free_bytes`,
/// `probe/ports_in_use` (one port a line), `probe/spark-kit-version`. Binding a specific IPv4
/// that `cmd/ip-addr` does not list fails, as on the real node.
#[derive(Debug, Clone)]
pub struct RecordedProbe {
    pub root: PathBuf,
}

impl RecordedProbe {
    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }
}

impl ProbeSource for RecordedProbe {
    fn read(&self, path: &str) -> Result<String, ProbeError> {
        std::fs::read_to_string(self.path(path)).map_err(|e| io_error(path, &e))
    }

    fn list(&self, path: &str) -> Result<Vec<String>, ProbeError> {
        LocalProbe::default().list(&self.path(path).to_string_lossy()).map_err(|_| ProbeError::NotFound(path.into()))
    }

    fn run(&self, name: &str, argv: &[&str]) -> Result<String, ProbeError> {
        let fail = self.root.join("cmd").join(format!("{name}.fail"));
        if let Ok(why) = std::fs::read_to_string(&fail) {
            return Err(ProbeError::Failed { what: argv.join(" "), why: why.trim().to_string() });
        }
        std::fs::read_to_string(self.root.join("cmd").join(name))
            .map_err(|_| ProbeError::NotFound(argv.first().copied().unwrap_or(name).to_string()))
    }

    fn free_bytes(&self, _path: &str) -> Result<u64, ProbeError> {
        let t = self.read("/probe/free_bytes")?;
        t.trim().parse().map_err(|_| ProbeError::Failed { what: "probe/free_bytes".into(), why: "not a number".into() })
    }

    fn port_free(&self, host: &str, port: u16) -> Result<bool, ProbeError> {
        // As the kernel does: a specific IPv4 the node does not carry cannot be bound.
        if let Ok(ip) = host.parse::<std::net::Ipv4Addr>() {
            let carried = self.run("ip-addr", &["ip"]).unwrap_or_default();
            if !ip.is_unspecified()
                && !ip.is_loopback()
                && !super::parse::ipv4_addrs(&carried).iter().any(|a| a.0 == ip)
            {
                return Err(ProbeError::Failed {
                    what: format!("bind {host}:{port}"),
                    why: "Cannot assign requested address (os error 99)".into(),
                });
            }
        }
        let used = self.read("/probe/ports_in_use").unwrap_or_default();
        Ok(!used.lines().any(|l| l.trim() == port.to_string()))
    }

    fn spark_kit_version(&self) -> Result<String, ProbeError> {
        self.read("/probe/spark-kit-version").map(|s| s.trim().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(timeout_s: u64, script: &str) -> Result<String, ProbeError> {
        LocalProbe { timeout_s }.run("sh", &["sh", "-c", script])
    }

    #[test]
    fn output_beyond_a_pipe_buffer_comes_back_whole() {
        let out = sh(20, "head -c 1048576 /dev/zero | tr '\\0' x").unwrap();
        assert_eq!(out.len(), 1_048_576);
    }

    #[test]
    fn each_way_to_fail_is_named() {
        let failed = |why: &str| ProbeError::Failed { what: String::new(), why: why.into() };
        let why = |r: Result<String, ProbeError>| match r {
            Err(ProbeError::Failed { why, .. }) => failed(&why),
            other => panic!("{other:?}"),
        };
        let e = sh(20, "head -c 300000 /dev/zero; echo; echo 'first line' >&2; echo second >&2; exit 3");
        assert_eq!(why(e), failed("exit status: 3: first line"));
        assert_eq!(why(sh(1, "sleep 30")), failed("no answer within 1 s"));
        assert_eq!(
            why(sh(1, "echo hi; sleep 4 &")),
            failed("it exited, but a process it started held its output open past 1 s")
        );
        let e = LocalProbe { timeout_s: 1 }.run("nope", &["/nonexistent/spark-kit-probe"]).unwrap_err();
        assert_eq!(e, ProbeError::NotFound("/nonexistent/spark-kit-probe".into()));
    }
}
