//! The `docker` CLI as spark-kit uses it: daemon check, image ids, containers by label, kill.
//! What the CLI's errors mean is decided by pure functions over its stderr ([`classify`]), so
//! each failure becomes one line with its fix. The daemon is whatever `docker` talks to
//! (`DOCKER_HOST`, the default socket). No call waits on the daemon without an end: a short one
//! has a time limit ([`docker_within`], [`query`]), a long one the daemon's heartbeat ([`long`]).

use std::process::{Command, ExitStatus};
use std::time::Duration;

use super::heartbeat;
use crate::bounded::{self, Ended};

/// Labels on every container spark-kit starts.
pub const LABEL_KIT: &str = "spark-kit.kit";
pub const LABEL_NODE: &str = "spark-kit.node";
pub const LABEL_RANK: &str = "spark-kit.rank";

/// Why a docker call failed, classified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DockerError {
    #[error("docker is not installed on this node (no `docker` command)")]
    NotInstalled,
    #[error("the Docker daemon is not running here ({0})")]
    NoDaemon(String),
    #[error("no permission to use the Docker daemon's socket ({0})")]
    Permission(String),
    #[error("image `{0}` is not on this node")]
    NoImage(String),
    #[error("docker {what} failed: {why}")]
    Failed { what: String, why: String },
    #[error("the Docker daemon did not answer `docker {what}` within {secs} s")]
    NoAnswer { what: String, secs: u64 },
    #[error("the Docker daemon stopped answering during `docker {what}` ({checks} checks {every_s} s apart got no answer); the call was stopped")]
    Unresponsive { what: String, checks: u32, every_s: u64 },
}

impl DockerError {
    /// The one-line fix.
    #[must_use]
    pub fn fix(&self) -> String {
        match self {
            Self::NotInstalled => {
                "install Docker (Debian/Ubuntu: `sudo apt-get install docker.io`), or set engine.runtime=venv".into()
            }
            Self::NoDaemon(_) => {
                "start it (`sudo systemctl start docker`), or point DOCKER_HOST at a running daemon".into()
            }
            Self::Permission(_) => {
                "add your user to the docker group (`sudo usermod -aG docker $USER`, then log in again), or run as root"
                    .into()
            }
            Self::NoImage(i) => format!(
                "load it on this node (`docker load -i <file>`), or run `spark-kit image sync` to copy it from the head; image: {i}"
            ),
            Self::Failed { .. } => "see the message; `docker info` shows the daemon's state".into(),
            Self::NoAnswer { .. } | Self::Unresponsive { .. } => "check the daemon (`sudo systemctl status docker`, restart it with `sudo systemctl restart docker`), or point DOCKER_HOST at one that answers".into(),
        }
    }
}

/// What a failed docker call's stderr means. `what` names the call (`info`, `image inspect`).
#[must_use]
pub fn classify(what: &str, stderr: &str, image: Option<&str>) -> DockerError {
    let line = stderr.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("").to_string();
    let lower = stderr.to_ascii_lowercase();
    if lower.contains("permission denied") && (lower.contains("docker daemon socket") || lower.contains("docker api")) {
        DockerError::Permission(line)
    } else if lower.contains("cannot connect to the docker daemon") || lower.contains("is the docker daemon running") {
        DockerError::NoDaemon(line)
    } else if lower.contains("no such image") || lower.contains("no such object") {
        DockerError::NoImage(image.unwrap_or_default().to_string())
    } else {
        DockerError::Failed { what: what.to_string(), why: line }
    }
}

/// A long call (`import`, `save`, `load`) on this node's daemon, watched by its heartbeat
/// ([`heartbeat::LONG_CALLS`]) instead of a time limit; `still` hears the time since the start
/// every 10 s.
pub fn long(args: &[&str], image: Option<&str>, still: &mut dyn FnMut(Duration)) -> Result<String, DockerError> {
    let mut cmd = Command::new("docker");
    cmd.args(args);
    let alive = &mut || check_daemon().map(drop);
    heartbeat::watched(&mut cmd, &call_name(args), image, heartbeat::LONG_CALLS, alive, still)
}

/// A finished call's stdout, trimmed, or its stderr classified; `what` names the call.
pub(super) fn answer(
    what: &str,
    image: Option<&str>,
    status: ExitStatus,
    stdout: &[u8],
    stderr: &[u8],
) -> Result<String, DockerError> {
    if status.success() {
        Ok(String::from_utf8_lossy(stdout).trim().to_string())
    } else {
        Err(classify(what, &String::from_utf8_lossy(stderr), image))
    }
}

/// How a call is named in errors: its first two arguments (`image inspect`, `ps -a`).
fn call_name(args: &[&str]) -> String {
    args.iter().take(2).copied().collect::<Vec<_>>().join(" ")
}

/// How long a query of the daemon (`ps`, `inspect`, `info`) may take: a daemon that accepts and
/// never answers (the docker client then waits forever) fails it instead of hanging `status`,
/// the memory guard or a build; preflight's probes give the same calls the same 10 s.
pub const QUERY_LIMIT: Duration = Duration::from_secs(10);

/// A query of the daemon: [`docker_within`] [`QUERY_LIMIT`].
pub fn query(args: &[&str], image: Option<&str>) -> Result<String, DockerError> {
    docker_within(args, image, QUERY_LIMIT)
}

/// `docker args…` within `limit`: its stdout, trimmed, or the classified error; past the limit, or
/// with its output held open, [`DockerError::NoAnswer`].
pub fn docker_within(args: &[&str], image: Option<&str>, limit: Duration) -> Result<String, DockerError> {
    let what = call_name(args);
    match bounded::run(Command::new("docker").args(args), limit).map_err(|e| spawn_error(&what, &e))? {
        Ended::Exited { status, stdout, stderr } => answer(&what, image, status, &stdout, &stderr),
        Ended::Late { .. } | Ended::HeldOpen => Err(DockerError::NoAnswer { what, secs: limit.as_secs() }),
    }
}

/// Why a call (named `what`) could not be started.
pub(super) fn spawn_error(what: &str, e: &std::io::Error) -> DockerError {
    if e.kind() == std::io::ErrorKind::NotFound {
        DockerError::NotInstalled
    } else {
        DockerError::Failed { what: what.into(), why: e.to_string() }
    }
}

/// The daemon answers (`docker version`: the lightest call it answers, also while busy); its
/// server version.
pub fn check_daemon() -> Result<String, DockerError> {
    query(&["version", "--format", "{{.Server.Version}}"], None)
}

/// The image id of `image` on this node (`sha256:…`), None when it is not there.
pub fn image_id(image: &str) -> Result<Option<String>, DockerError> {
    match query(&["image", "inspect", "--format", "{{.Id}}", image], Some(image)) {
        Ok(id) => Ok(Some(id)),
        Err(DockerError::NoImage(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A container as `docker ps` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Listed {
    pub id: String,
    pub name: String,
    pub state: String,
}

/// `docker ps -a --filter label=KEY=VALUE --format '{{.ID}}\t{{.Names}}\t{{.State}}'` lines.
#[must_use]
pub fn parse_ps(text: &str) -> Vec<Listed> {
    text.lines()
        .filter_map(|l| {
            let mut p = l.split('\t');
            let (id, name) = (p.next()?.trim(), p.next()?.trim());
            (!id.is_empty()).then(|| Listed { id: id.into(), name: name.into(), state: p.next().unwrap_or("").into() })
        })
        .collect()
}

/// Containers (running or not) labelled `key=value`.
pub fn containers_labelled(key: &str, value: &str) -> Result<Vec<Listed>, DockerError> {
    let filter = format!("label={key}={value}");
    let format = "{{.ID}}\t{{.Names}}\t{{.State}}";
    let text = query(&["ps", "-a", "--no-trunc", "--filter", &filter, "--format", format], None)?;
    Ok(parse_ps(&text))
}

/// Containers (running or not) of every spark-kit deployment, each with the kit it is labelled with.
pub fn containers_of_every_kit() -> Result<Vec<(String, Listed)>, DockerError> {
    let filter = format!("label={LABEL_KIT}");
    let format = format!("{{{{.Label \"{LABEL_KIT}\"}}}}\t{{{{.ID}}}}\t{{{{.Names}}}}\t{{{{.State}}}}");
    let text = query(&["ps", "-a", "--no-trunc", "--filter", &filter, "--format", &format], None)?;
    Ok(parse_ps_by_kit(&text))
}

/// `<kit>\t<id>\t<name>\t<state>` lines ([`containers_of_every_kit`]).
#[must_use]
pub fn parse_ps_by_kit(text: &str) -> Vec<(String, Listed)> {
    text.lines()
        .filter_map(|l| {
            let (kit, rest) = l.split_once('\t')?;
            Some((kit.trim().to_string(), parse_ps(rest).pop()?))
        })
        .collect()
}

/// State of a container: (full id, host pid of its main process, running).
pub fn inspect(name: &str) -> Result<Option<(String, i32, bool)>, DockerError> {
    match query(&["container", "inspect", "--format", "{{.Id}} {{.State.Pid}} {{.State.Running}}", name], None) {
        Ok(t) => Ok(parse_inspect(&t)),
        Err(DockerError::NoImage(_)) => Ok(None),
        Err(DockerError::Failed { why, .. }) if why.to_ascii_lowercase().contains("no such container") => Ok(None),
        Err(e) => Err(e),
    }
}

/// `<id> <pid> <running>` → parts.
#[must_use]
pub fn parse_inspect(text: &str) -> Option<(String, i32, bool)> {
    let mut p = text.split_whitespace();
    Some((p.next()?.to_string(), p.next()?.parse().ok()?, p.next()? == "true"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_named_with_their_fix() {
        let absent =
            "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\n";
        assert!(matches!(classify("info", absent, None), DockerError::NoDaemon(l) if l.starts_with("Cannot connect")));
        let perm = "permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.24/info\": dial unix /var/run/docker.sock: connect: permission denied\n";
        let e = classify("info", perm, None);
        assert!(matches!(e, DockerError::Permission(_)));
        assert!(e.fix().contains("usermod -aG docker"));
        // Docker 28's wording.
        let perm28 = "permission denied while trying to connect to the docker API at unix:///var/run/docker.sock";
        assert!(matches!(classify("info", perm28, None), DockerError::Permission(_)));
        assert_eq!(
            classify("image inspect", "Error: No such image: vllm/x:1\n", Some("vllm/x:1")),
            DockerError::NoImage("vllm/x:1".into())
        );
        assert_eq!(
            classify("image inspect", "Error response from daemon: No such image: vllm/x:1\n", Some("vllm/x:1")),
            DockerError::NoImage("vllm/x:1".into())
        );
        assert!(matches!(classify("run", "\nboom\n", None), DockerError::Failed { why, .. } if why == "boom"));
        assert!(DockerError::NotInstalled.fix().contains("apt-get install docker.io"));
    }

    #[test]
    fn listings() {
        let ps = "abc\tspark-kit-t-local\trunning\ndef\tother\texited\n\n";
        assert_eq!(parse_ps(ps).len(), 2);
        assert_eq!(parse_ps(ps)[1], Listed { id: "def".into(), name: "other".into(), state: "exited".into() });
        assert_eq!(parse_inspect("abc 1234 true\n"), Some(("abc".into(), 1234, true)));
        assert_eq!(parse_inspect("abc 0 false"), Some(("abc".into(), 0, false)));
        assert_eq!(parse_inspect("abc"), None);
        let by_kit = parse_ps_by_kit("tiny-cpu-docker\tabc\tspark-kit-a\trunning\nmine\tdef\tspark-kit-b\texited\n\n");
        assert_eq!(by_kit.len(), 2);
        assert_eq!(
            by_kit[1],
            ("mine".into(), Listed { id: "def".into(), name: "spark-kit-b".into(), state: "exited".into() })
        );
    }
}
