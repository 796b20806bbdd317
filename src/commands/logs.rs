//! `spark-kit logs [--node N] [-f] [-n LINES]`: the engine logs, read on each node through its
//! transport (`tail`). Every line carries its time, node and rank (written so by the agent).

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use super::{io_failure, load, Context};
use crate::cli::LogsArgs;
use crate::cluster::transport;
use crate::engine::process::log_path;
use crate::error::Failure;

pub fn run(args: &LogsArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    // A running deployment's own kit (the nodes it really started), else the kit the flags name.
    let kit = match super::target::find(&args.kit, &ctx.env, "logs") {
        Ok(t) => t.kit,
        Err(f) if f.code == crate::error::ExitCode::Usage => return Err(f),
        Err(_) => load::resolve(&args.kit, &ctx.env)?.kit,
    };
    let nodes: Vec<_> = kit.nodes.iter().filter(|n| args.node.as_deref().is_none_or(|w| w == n.name)).collect();
    if nodes.is_empty() {
        let names: Vec<&str> = kit.nodes.iter().map(|n| n.name.as_str()).collect();
        return Err(Failure::usage(format!(
            "--node {}: no such node in kit {}; nodes: {}",
            args.node.as_deref().unwrap_or_default(),
            kit.name,
            names.join(", ")
        )));
    }
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let mut children = Vec::new();
    for node in nodes {
        // The path on the node: its own `~`, so expand there (`$HOME`).
        let logs = kit.paths.logs.replacen('~', "$HOME", 1);
        let path = log_path(std::path::Path::new(&logs), &kit.name, &node.name);
        let follow = if args.follow { "-F " } else { "" };
        // With -F, tail waits for a missing file forever: say so at once and fail instead.
        let check = if args.follow {
            format!("test -r \"{0}\" || {{ echo \"cannot open {0}\" >&2; exit 1; }}; ", path.display())
        } else {
            String::new()
        };
        let script = format!("{check}exec tail -n {} {follow}\"{}\"", args.lines, path.display());
        let mut child = transport::shell(node, &script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                Failure::runtime(format!("cannot read logs of node {}: {e}", node.name)).caused_by_chain_of(&e)
            })?;
        // Log lines carry their node and rank already; what `tail` (or ssh) itself says gets the
        // node name, and its last line is kept for the error.
        let last_err = Arc::new(Mutex::new(String::new()));
        for (stream, prefix, keep) in [
            (child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>), String::new(), None),
            (
                child.stderr.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
                format!("[{}] ", node.name),
                Some(Arc::clone(&last_err)),
            ),
        ] {
            let Some(stream) = stream else { continue };
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Some(k) = &keep {
                        if let Ok(mut k) = k.lock() {
                            k.clone_from(&line);
                        }
                    }
                    if tx.send(format!("{prefix}{line}")).is_err() {
                        return;
                    }
                }
            });
        }
        children.push((node.name.clone(), child, last_err));
    }
    drop(tx);
    for line in rx {
        writeln!(ctx.out, "{line}").map_err(|e| io_failure(&e))?;
    }
    let mut failed = Vec::new();
    for (name, mut c, last_err) in children {
        let status = c.wait().map_err(|e| Failure::runtime(format!("node {name}: {e}")).caused_by_chain_of(&e))?;
        if !status.success() {
            let why = last_err.lock().map(|s| s.trim().to_string()).unwrap_or_default();
            failed.push(format!("node {name}: cannot read its engine log ({status}: {why})"));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::runtime(failed.join("\n"))
            .with_hint("check that the node is reachable and that its engine ran (`paths.logs` on the node)"))
    }
}
