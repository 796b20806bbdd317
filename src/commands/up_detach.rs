//! `up --detach`: re-run the same command line without `--detach` in a new session, its output
//! to the supervisor log; return once the deployment is ready (or failed).

use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::up_text::{banner, failure_from, still_running_hint};
use super::{io_failure, Context};
use crate::error::Failure;
use crate::reporter::BootProgress;
use crate::settings::Settings;
use crate::supervisor::control::request;
use crate::supervisor::state::State;

/// The command line of the background supervisor: this one without `--detach`, `restart` as `up`.
fn background_args(args: &[String]) -> Vec<String> {
    args.iter()
        .skip(1)
        .filter(|a| *a != "--detach" && *a != "-d")
        .map(|a| if a == "restart" { "up".into() } else { a.clone() })
        .collect()
}

/// Start the supervisor in the background and wait until it is ready.
pub fn detach(s: &Settings, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let exe = crate::dirs::self_exe()
        .map_err(|e| Failure::runtime(format!("cannot find the spark-kit executable: {e}")).caused_by_chain_of(&e))?;
    let log_path = &s.supervisor_log;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .map_err(|e| Failure::runtime(format!("cannot open {}: {e}", log_path.display())).caused_by_chain_of(&e))?;
    let err = log.try_clone()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(background_args(&ctx.args)).stdin(Stdio::null()).stdout(log).stderr(err);
    // SAFETY: setsid between fork and exec is async-signal-safe and touches no Rust state.
    unsafe {
        cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Failure::runtime(format!("cannot start the supervisor: {e}")).caused_by_chain_of(&e))?;
    let _ =
        writeln!(ctx.err, "==> supervisor started in the background (pid {}, log {})", child.id(), log_path.display());
    let started = Instant::now();
    let limit = Duration::from_secs(u64::from(s.kit.engine.ready_timeout_s) + 120);
    let mut progress = BootProgress::new();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let tail = crate::engine::process::tail(log_path, 15);
            return Err(Failure::runtime(format!("the supervisor exited ({status}); last lines:\n{tail}"))
                .with_hint(format!("full log: {}", log_path.display())));
        }
        if let Ok(snap) = request(&s.socket, &s.kit.name, "status", Some(Duration::from_secs(5))) {
            progress.show(&snap, &mut *ctx.err);
            match snap.state {
                State::Ready => {
                    let text = banner(&snap, started.elapsed().as_secs_f64(), s.key.as_ref(), &s.kit_ref);
                    writeln!(ctx.out, "{text}\nsupervisor: pid {}, in the background", snap.supervisor_pid)
                        .map_err(|e| io_failure(&e))?;
                    return Ok(());
                }
                State::Failed => return Err(failure_from(&snap, &s.kit_ref)),
                _ => {}
            }
        }
        if started.elapsed() > limit {
            return Err(Failure::runtime(format!(
                "not ready after {} s; it keeps running in the background",
                limit.as_secs()
            ))
            .with_hint(still_running_hint(&s.kit_ref)));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::background_args;

    #[test]
    fn the_background_command_line_drops_detach_and_restarts_as_up() {
        let args: Vec<String> =
            ["spark-kit", "restart", "-d", "--kit", "tiny-cpu", "--detach"].map(String::from).into();
        assert_eq!(background_args(&args), ["up", "--kit", "tiny-cpu"]);
    }
}
