//! A node's engine as a container, for the docker runtime: the `docker run` client runs in the
//! foreground as the engine process ([`super::process::spawn`]: own process group, PDEATHSIG,
//! its output — the container's — into the same tagged, rotated log and hang-detector sink as a
//! venv engine); stopping is `docker stop -t <timeout>` then `docker rm -f`, and a deployment's
//! containers can be removed by label.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::dockerctl::{self, DockerError, LABEL_KIT};
use crate::engine::process::{self, Engine, Launch, LineSink, SpawnError};

/// Variables that tell the docker client which daemon to talk to (the engine's own environment
/// is passed with `--env` inside the `docker run` argv).
const CLIENT_ENV: &[&str] =
    &["DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY"];

/// The docker client's variables from `env`.
#[must_use]
pub fn client_env(env: &[(String, String)]) -> Vec<(String, String)> {
    env.iter().filter(|(k, _)| CLIENT_ENV.contains(&k.as_str())).cloned().collect()
}

/// Start `docker run …` (`run_argv`, from [`super::run::run_argv`]) in the foreground.
pub fn launch(
    run_argv: &[String],
    env: &[(String, String)],
    log: PathBuf,
    tag: String,
    sink: Option<LineSink>,
) -> Result<Engine, SpawnError> {
    launch_with(run_argv, env, &[], log, tag, sink)
}

/// [`launch`], with `passed` added to the client's environment: the values of the variables
/// the argv passes by name (`--env NAME`, e.g. the API key).
pub fn launch_with(
    run_argv: &[String],
    env: &[(String, String)],
    passed: &[(String, String)],
    log: PathBuf,
    tag: String,
    sink: Option<LineSink>,
) -> Result<Engine, SpawnError> {
    let (program, args) = run_argv.split_first().map_or(("docker", &[][..]), |(p, a)| (p.as_str(), a));
    let mut client = client_env(env);
    client.extend(passed.iter().cloned());
    let launch =
        Launch { program: program.into(), args: args.to_vec(), env: client.into_iter().collect(), log, tag, sink };
    process::spawn(&launch, env)
}

/// `docker stop -t <timeout_s> <name>`, then `docker rm -f <name>` if it is still listed a moment
/// later (a `--rm` container is removed by the daemon itself once it stops; racing that removal
/// with `rm -f` can leave it "Removal In Progress"), then wait (≤ 10 s) until the daemon no
/// longer lists it. A container that is already gone is fine. A daemon that does not answer
/// fails each call after its limit ([`DockerError::NoAnswer`]): the stop's own timeout plus
/// [`ACTION_MARGIN`], the removal the margin.
pub fn stop(name: &str, timeout_s: u32) -> Result<(), DockerError> {
    let limit = Duration::from_secs(u64::from(timeout_s)) + ACTION_MARGIN;
    match dockerctl::docker_within(&["stop", "-t", &timeout_s.to_string(), name], None, limit) {
        Ok(_) => {}
        Err(e) if no_such(&e) => {}
        Err(e) => return Err(e),
    }
    if !wait_gone(name, Duration::from_secs(5))? {
        remove(name)?;
    }
    Ok(())
}

/// What a stop or removal may take beyond its own timeout before the daemon counts as not answering.
const ACTION_MARGIN: Duration = Duration::from_secs(30);

fn no_such(e: &DockerError) -> bool {
    matches!(e, DockerError::Failed { why, .. } if why.to_ascii_lowercase().contains("no such container"))
}

/// `docker rm -f`, then wait until it is no longer listed.
fn remove(name: &str) -> Result<(), DockerError> {
    match dockerctl::docker_within(&["rm", "-f", name], None, ACTION_MARGIN) {
        Ok(_) => {}
        Err(e) if no_such(&e) => {}
        Err(DockerError::Failed { why, .. }) if why.contains("already in progress") => {}
        Err(e) => return Err(e),
    }
    if wait_gone(name, Duration::from_secs(10))? {
        Ok(())
    } else {
        Err(DockerError::Failed {
            what: "rm".into(),
            why: format!("container {name} is still listed 10 s after docker rm -f"),
        })
    }
}

/// Poll `docker ps -a` (not `inspect`: a container being removed is listed but not inspectable)
/// until `name` (a name or an id) is gone; false if it is still there after `limit`.
fn wait_gone(name: &str, limit: Duration) -> Result<bool, DockerError> {
    let until = Instant::now() + limit;
    loop {
        let text = dockerctl::query(&["ps", "-a", "--no-trunc", "--format", "{{.ID}}\t{{.Names}}\t{{.State}}"], None)?;
        if !dockerctl::parse_ps(&text).iter().any(|c| c.name == name || c.id.starts_with(name)) {
            return Ok(true);
        }
        if Instant::now() > until {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The running container `name` as the memory guard follows it (id and main pid on the host);
/// None when it is not running.
pub fn engine_ref(name: &str) -> Result<Option<crate::memguard::EngineRef>, DockerError> {
    Ok(dockerctl::inspect(name)?.and_then(|(id, pid, running)| {
        let id = crate::memguard::ContainerId::parse(&id)?;
        (running && pid > 0).then_some(crate::memguard::EngineRef::Container { id, pid })
    }))
}

/// Remove (`docker rm -f`) every container labelled as kit `kit`'s; their names.
pub fn remove_deployment(kit: &str) -> Result<Vec<String>, DockerError> {
    let left = dockerctl::containers_labelled(LABEL_KIT, kit)?;
    for c in &left {
        remove(&c.id)?;
    }
    Ok(left.into_iter().map(|c| c.name).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_clients_variables_pass() {
        let env = vec![("DOCKER_HOST".to_string(), "unix:///x".to_string()), ("SECRET".to_string(), "y".to_string())];
        assert_eq!(client_env(&env), vec![("DOCKER_HOST".to_string(), "unix:///x".to_string())]);
    }
}
