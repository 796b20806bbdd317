//! `spark-kit up [--detach]` and `spark-kit restart`: bring the deployment up through one node
//! agent per node and supervise it; Ctrl-C / SIGTERM / `down` drain and stop everything.

use std::io::{IsTerminal as _, Write as _};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{io_failure, load, Context};
use crate::agent::runtime::{check_port, UpError};
use crate::cli::UpArgs;
use crate::dirs::logs_dir;
use crate::dirs::Dirs;
use crate::engine::boot_phase::{progress_line, Pacer, CLEAR_LINE};
use crate::error::Failure;
use crate::gateway::{DrainOutcome, Front};
use crate::hints::{curl_example, KeySource, KitRef};
use crate::kit::schema::{Kit, Role, Transport};
use crate::kit::{Origin, Override};
use crate::live;
use crate::supervisor::control::{pid_path, request, serve, socket_path};
use crate::supervisor::state::{Policy, State};
use crate::supervisor::{self, ClusterReporter, Gates, Handles, Snapshot};
use crate::weights::listing::{weight_trees, WeightTree};

/// The signal (SIGINT or SIGTERM) that asked the foreground `up` to stop; 0 = none.
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: nix::libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

/// SIGINT/SIGTERM set a flag (async-signal-safe); a thread forwards it to the supervisor.
fn install_signals(stop: Arc<AtomicBool>) -> Result<(), Failure> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(SigHandler::Handler(on_signal), SaFlags::SA_RESTART, SigSet::empty());
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }
            .map_err(|e| Failure::runtime(format!("cannot install {sig} handler: {e}")))?;
    }
    std::thread::spawn(move || loop {
        if SIGNALLED.load(Ordering::SeqCst) != 0 {
            stop.store(true, Ordering::SeqCst);
        }
        std::thread::sleep(Duration::from_millis(100));
    });
    Ok(())
}

/// What the printed commands need: the kit as the user named it, where the API key comes from.
#[derive(Clone)]
struct Hints {
    kit_ref: KitRef,
    key: Option<KeySource>,
}

impl Hints {
    fn banner(&self, s: &Snapshot, secs: f64, log_hint: &str) -> String {
        banner(s, secs, log_hint, self.key.as_ref(), &self.kit_ref)
    }
}

/// A progress line is on the terminal (redrawn in place) and must be erased before other output.
static PROGRESS_SHOWN: AtomicBool = AtomicBool::new(false);

fn clear_progress(err: &mut dyn std::io::Write) {
    if PROGRESS_SHOWN.swap(false, Ordering::SeqCst) {
        let _ = write!(err, "{CLEAR_LINE}");
    }
}

struct Lines;
impl ClusterReporter for Lines {
    fn line(&self, text: &str) {
        let mut err = std::io::stderr();
        clear_progress(&mut err);
        let _ = writeln!(err, "{text}");
    }
}

/// While the engines boot (some started, `/health` not yet 200): seconds since the first engine
/// started and the progress line with every started node's phase.
fn boot_progress(s: &Snapshot) -> Option<(u64, String)> {
    if s.state != State::Starting {
        return None;
    }
    let started: Vec<_> = s.nodes.iter().filter(|n| n.engine_alive && n.uptime_s.is_some()).collect();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // whole seconds, >= 0
    let secs = started.iter().filter_map(|n| n.uptime_s).fold(0.0, f64::max) as u64;
    if started.is_empty() {
        return None;
    }
    let phases: Vec<(String, Option<String>)> = started.iter().map(|n| (n.name.clone(), n.phase.clone())).collect();
    Some((secs, progress_line(secs, &phases)))
}

/// Show the boot progress of `s` through `pacer` on `err` (stderr).
fn show_progress(s: &Snapshot, pacer: &mut Pacer, tty: bool, err: &mut dyn std::io::Write) {
    match boot_progress(s) {
        Some((secs, line)) => {
            if let Some(text) = pacer.tick(secs, &line) {
                let _ = write!(err, "{text}");
                let _ = err.flush();
                if tty {
                    PROGRESS_SHOWN.store(true, Ordering::SeqCst);
                }
            }
        }
        None => clear_progress(err),
    }
}

fn resolve(args: &UpArgs, ctx: &Context<'_>) -> Result<Kit, Failure> {
    let mut flags = load::flag_overrides(&args.kit)?;
    if let Some(t) = &args.shutdown_timeout {
        // A common flag: above the environment, below --set.
        flags.insert(
            0,
            Override {
                path: vec!["engine".into(), "shutdown_timeout_s".into()],
                raw: t.clone(),
                origin: Origin::Flag("--shutdown-timeout".into()),
            },
        );
    }
    let src = crate::kit::source(args.kit.kit.as_deref()).map_err(load::kit_failure)?;
    Ok(crate::kit::resolve(src, &ctx.env, &flags).map_err(load::kit_failure)?.kit)
}

/// The ready banner: endpoint, model, a `curl` that works as copied (with the API key's header
/// when the kit has keys), where the logs are, and the commands for this deployment.
fn banner(s: &Snapshot, secs: f64, log_hint: &str, key: Option<&KeySource>, kit_ref: &KitRef) -> String {
    let base = s.endpoint.trim_end_matches("/v1");
    let model = &s.model;
    let curl = curl_example(&format!("{base}/v1"), model, key);
    format!(
        "ready in {secs:.1} s\nendpoint: {base}/v1\nmodel:    {model}\ntry:      {curl}\nlogs:     {log_hint}\nstatus:   {}\nfollow:   {}\nstop:     {}",
        kit_ref.command("status", &[]),
        kit_ref.command("logs", &["-f"]),
        kit_ref.command("down", &[]),
    )
}

fn failure_from(s: &Snapshot, kit_ref: &KitRef) -> Failure {
    let mut msg = s.reason.clone().unwrap_or_else(|| "the deployment failed".into());
    for n in &s.nodes {
        if let Some(e) = &n.last_error {
            msg.push_str(&format!("\n{}: {e}", n.name));
        }
    }
    let log = s.nodes.iter().find_map(|n| n.engine_log.clone());
    let f = Failure::runtime(msg);
    match log {
        Some(l) => f.with_hint(format!("full engine log: {l}")),
        None => f.with_hint(format!("see {}", kit_ref.quoted("logs", &[]))),
    }
}

pub fn run(args: &UpArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let kit = resolve(args, ctx)?;
    let kit_ref = KitRef::new(args.kit.kit.as_deref());
    let key = KeySource::of(&kit.engine.api_keys, &ctx.env);
    let dirs = Dirs::from_env(&ctx.env);
    let logs = logs_dir(&kit, &dirs);
    std::fs::create_dir_all(&logs).map_err(|e| Failure::runtime(format!("cannot create {}: {e}", logs.display())))?;
    let sock = socket_path(&logs, &kit.name);
    if let Ok(s) = request(&sock, &kit.name, "status", Some(Duration::from_secs(5))) {
        return Err(Failure::runtime(format!(
            "kit {} is already running (supervisor pid {}, state {:?})",
            kit.name, s.supervisor_pid, s.state
        ))
        .with_hint(format!(
            "see {}, stop it with {}",
            kit_ref.quoted("status", &[]),
            kit_ref.quoted("down", &[])
        )));
    }
    // Fail before anything starts when the head's API port is taken (vLLM would notice late).
    if kit.nodes.iter().any(|n| n.role == Role::Head && n.transport == Transport::Local) {
        check_port(&kit.engine.host, kit.engine.port).map_err(|e: UpError| {
            let f = Failure::runtime(e.to_string());
            match e.hint() {
                Some(h) => f.with_hint(h),
                None => f,
            }
        })?;
    }
    // The gateway's settings are checked before anything starts (detached or not).
    let (gw_cfg, gw_note) = super::up_gateway::config(&kit, &ctx.env, &dirs)?;
    if args.detach {
        return detach(&kit, ctx, &logs, &Hints { kit_ref, key });
    }
    let gw_line = super::up_gateway::summary(&gw_cfg, gw_note.as_deref());
    let front = Front::start(gw_cfg).map_err(|e| Failure::runtime(e.to_string()))?;
    Lines.line(&gw_line);
    let handles = Handles::new(&kit).with_front(front);
    install_signals(Arc::clone(&handles.stop))?;
    serve(&sock, handles.clone())
        .map_err(|e| Failure::runtime(format!("cannot open the control socket {}: {e}", sock.display())))?;
    let _ = std::fs::write(pid_path(&logs, &kit.name), std::process::id().to_string());
    let record = live::Record {
        schema: 1,
        kit_name: kit.name.clone(),
        kit_arg: live::recorded_arg(args.kit.kit.as_deref()),
        socket: sock.clone(),
        pid: std::process::id(),
        endpoint: supervisor::snapshot::initial_snapshot(&kit).endpoint,
        kit: kit.clone(),
    };
    let registered = live::register(&live::run_dir(&dirs), &record)
        .map_err(|e| {
            let _ = writeln!(ctx.err, "warning: cannot register in {}: {e}", live::run_dir(&dirs).display());
        })
        .ok();
    let started = Instant::now();
    let printer = {
        let snap = Arc::clone(&handles.snapshot);
        let verbose = args.verbose;
        let hints = Hints { kit_ref: kit_ref.clone(), key: key.clone() };
        std::thread::spawn(move || watch_ready(&snap, started, verbose, &hints))
    };
    let hf = crate::engine::model::hf_cache(
        kit.paths.hf_cache.as_deref().map(|p| dirs.expand(p)).as_deref(),
        &ctx.env,
        &dirs.home,
    );
    let gates = Gates {
        preflight: (!args.skip_preflight).then(|| crate::node::preflight::PreflightInput {
            gateway_holds_api_port: true,
            ..super::preflight_input::input(&kit, &ctx.env, args.kit.kit.as_deref())
        }),
        weight_trees: weight_trees(&kit, &hf, &dirs.expand(&kit.paths.engram_dir))
            .into_iter()
            .map(|t| WeightTree { path: dirs.expand(&t.path.to_string_lossy()), ..t })
            .collect(),
        home: dirs.home.clone(),
        replace: args.replace,
    };
    let result = supervisor::run(&kit, &logs, Policy::default(), &Lines, handles.clone(), &gates);
    // `down` is answered with the final snapshot before the process (and its socket) goes.
    crate::supervisor::control::wait_answered(Duration::from_secs(5));
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(pid_path(&logs, &kit.name));
    if let Some(p) = registered {
        live::unregister(&p);
    }
    drop(printer);
    match handles.drained() {
        Some(Ok(DrainOutcome::Idle)) => Lines.line("==> gateway drained: every in-flight request finished"),
        Some(Ok(DrainOutcome::TimedOut(n))) => Lines.line(&format!(
            "==> gateway: {n} requests were still in flight after engine.drain_timeout_s {} s; their streams were ended with an error event",
            kit.engine.drain_timeout_s
        )),
        Some(Err(e)) => Lines.line(&format!("warning: the gateway stopped serving: {e}")),
        None => {}
    }
    let snap = handles.snapshot.lock().map(|s| s.clone()).map_err(|_| Failure::runtime("supervisor state poisoned"))?;
    match result {
        // Stopped by Ctrl-C / SIGTERM: exit 128 + the signal, as shells expect (130, 143).
        Ok(0) => match SIGNALLED.load(Ordering::SeqCst) {
            0 => writeln!(ctx.err, "==> stopped").map_err(|e| io_failure(&e)),
            sig => {
                let name = nix::sys::signal::Signal::try_from(sig).map_or_else(|_| sig.to_string(), |s| s.to_string());
                writeln!(ctx.err, "==> stopped ({name})").map_err(|e| io_failure(&e))?;
                Err(Failure::signalled(sig))
            }
        },
        Ok(_) => Err(failure_from(&snap, &kit_ref)),
        Err(e) => Err(Failure::runtime_error(&e).with_hint_opt(e.hint())),
    }
}

/// Print the banner once the deployment is ready (and tail local engine logs with --verbose).
fn watch_ready(snap: &Arc<Mutex<Snapshot>>, started: Instant, verbose: bool, hints: &Hints) {
    let mut tails: Vec<String> = Vec::new();
    let mut printed = false;
    let tty = std::io::stderr().is_terminal();
    let mut pacer = Pacer::new(tty);
    let mut last_tick = Instant::now();
    loop {
        let s = match snap.lock() {
            Ok(s) => s.clone(),
            Err(_) => return,
        };
        if verbose {
            for n in &s.nodes {
                if let Some(log) = &n.engine_log {
                    if !tails.contains(log) && std::path::Path::new(log).exists() {
                        tails.push(log.clone());
                        let log = log.clone();
                        std::thread::spawn(move || tail_file(&log));
                    }
                }
            }
        }
        if last_tick.elapsed() >= Duration::from_secs(1) || boot_progress(&s).is_none() {
            last_tick = Instant::now();
            show_progress(&s, &mut pacer, tty, &mut std::io::stderr());
        }
        if !printed && s.state == State::Ready {
            printed = true;
            let logs = s.nodes.iter().filter_map(|n| n.engine_log.clone()).collect::<Vec<_>>().join(", ");
            let mut out = std::io::stdout();
            let _ = writeln!(
                out,
                "{}\nCtrl-C stops the deployment.",
                hints.banner(&s, started.elapsed().as_secs_f64(), &logs)
            );
            let _ = out.flush();
        }
        if matches!(s.state, State::Stopped | State::Failed) {
            return;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Print new lines of a local engine log (they carry their node and rank tags).
fn tail_file(path: &str) {
    use std::io::{BufRead, Seek};
    let Ok(mut f) = std::fs::File::open(path) else { return };
    let _ = f.seek(std::io::SeekFrom::End(0));
    let mut r = std::io::BufReader::new(f);
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => std::thread::sleep(Duration::from_millis(200)),
            Ok(_) => {
                let _ = writeln!(std::io::stderr(), "{}", line.trim_end());
            }
            Err(_) => return,
        }
    }
}

/// Re-run this same command line without `--detach` in a new session, output to the
/// supervisor log; return once it is ready (or failed).
fn detach(kit: &Kit, ctx: &mut Context<'_>, logs: &std::path::Path, hints: &Hints) -> Result<(), Failure> {
    let exe =
        crate::dirs::self_exe().map_err(|e| Failure::runtime(format!("cannot find the spark-kit executable: {e}")))?;
    let args: Vec<String> = ctx.args.iter().skip(1).filter(|a| *a != "--detach" && *a != "-d").cloned().collect();
    let args: Vec<String> = args.into_iter().map(|a| if a == "restart" { "up".into() } else { a }).collect();
    let log_path = logs.join(format!("{}-supervisor.log", kit.name));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| Failure::runtime(format!("cannot open {}: {e}", log_path.display())))?;
    let err = log.try_clone().map_err(|e| Failure::runtime(e.to_string()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&args).stdin(Stdio::null()).stdout(log).stderr(err);
    // SAFETY: setsid between fork and exec is async-signal-safe and touches no Rust state.
    unsafe {
        cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    let mut child = cmd.spawn().map_err(|e| Failure::runtime(format!("cannot start the supervisor: {e}")))?;
    let _ =
        writeln!(ctx.err, "==> supervisor started in the background (pid {}, log {})", child.id(), log_path.display());
    let sock = socket_path(logs, &kit.name);
    let started = Instant::now();
    let limit = Duration::from_secs(u64::from(kit.engine.ready_timeout_s) + 120);
    let tty = std::io::stderr().is_terminal();
    let mut pacer = Pacer::new(tty);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let tail = crate::engine::venv::tail(&log_path, 15);
            return Err(Failure::runtime(format!("the supervisor exited ({status}); last lines:\n{tail}"))
                .with_hint(format!("full log: {}", log_path.display())));
        }
        if let Ok(s) = request(&sock, &kit.name, "status", Some(Duration::from_secs(5))) {
            show_progress(&s, &mut pacer, tty, &mut *ctx.err);
            match s.state {
                State::Ready => {
                    let logs = s.nodes.iter().filter_map(|n| n.engine_log.clone()).collect::<Vec<_>>().join(", ");
                    writeln!(
                        ctx.out,
                        "{}\nsupervisor: pid {}, in the background",
                        hints.banner(&s, started.elapsed().as_secs_f64(), &logs),
                        s.supervisor_pid
                    )
                    .map_err(|e| io_failure(&e))?;
                    return Ok(());
                }
                State::Failed => return Err(failure_from(&s, &hints.kit_ref)),
                _ => {}
            }
        }
        if started.elapsed() > limit {
            return Err(Failure::runtime(format!(
                "not ready after {} s; it keeps running in the background",
                limit.as_secs()
            ))
            .with_hint(format!(
                "see {} and {}, or stop it with {}",
                hints.kit_ref.quoted("status", &[]),
                hints.kit_ref.quoted("logs", &[]),
                hints.kit_ref.quoted("down", &[])
            )));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `restart`: validate the kit first (a bad kit stops nothing), then `down` and `up --detach`.
pub fn restart(args: &UpArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let kit = resolve(args, ctx)?;
    let logs = logs_dir(&kit, &Dirs::from_env(&ctx.env));
    let sock = socket_path(&logs, &kit.name);
    if request(&sock, &kit.name, "status", Some(Duration::from_secs(5))).is_ok() {
        let _ = writeln!(ctx.err, "==> stopping the running deployment");
        request(&sock, &kit.name, "down", None).map_err(|e| Failure::runtime(e.to_string()))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while sock.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let detached = UpArgs {
        verbose: false,
        detach: true,
        shutdown_timeout: args.shutdown_timeout.clone(),
        skip_preflight: args.skip_preflight,
        replace: args.replace,
        kit: args.kit.clone(),
    };
    run(&detached, ctx)
}
