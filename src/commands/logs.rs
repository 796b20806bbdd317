//! `spark-kit logs [--node N] [-f] [-n LINES]`: the engine logs, read on each node through its
//! transport (`tail`). Every line carries its time, node and rank (written so by the agent).

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use super::{io_failure, load, Context};
use crate::cli::LogsArgs;
use crate::cluster::transport;
use crate::engine::process::log_path;
use crate::error::Failure;

pub fn run(args: &LogsArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let kit = load::resolve(&args.kit, &ctx.env)?.kit;
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
        let script = format!("tail -n {} {follow}\"{}\"", args.lines, path.display());
        let mut child = transport::shell(node, &script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Failure::runtime(format!("cannot read logs of node {}: {e}", node.name)))?;
        // Log lines carry their node and rank already; what `tail` itself says gets the node name.
        for (stream, prefix) in [
            (child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>), String::new()),
            (child.stderr.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>), format!("[{}] ", node.name)),
        ] {
            let Some(stream) = stream else { continue };
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(format!("{prefix}{line}")).is_err() {
                        return;
                    }
                }
            });
        }
        children.push(child);
    }
    drop(tx);
    for line in rx {
        writeln!(ctx.out, "{line}").map_err(|e| io_failure(&e))?;
    }
    for mut c in children {
        let _ = c.wait();
    }
    Ok(())
}
