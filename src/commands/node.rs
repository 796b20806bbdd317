//! `spark-kit node --rank N` (hidden): the node agent. Events on stdout, commands on stdin.

use super::Context;
use crate::agent::{self, JsonLines};
use crate::cli::NodeArgs;
use crate::error::Failure;

pub fn run(args: &NodeArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    // A Ctrl-C in the terminal reaches the whole foreground group, agents included; the agent
    // must outlive it to stop its engine in order (the supervisor tells it to, or stdin closes).
    // SAFETY: installing SIG_IGN runs no code of ours in signal context.
    let _ = unsafe { nix::sys::signal::signal(nix::sys::signal::Signal::SIGINT, nix::sys::signal::SigHandler::SigIgn) };
    let mut out = JsonLines(std::io::stdout());
    match agent::run(args.rank, &ctx.env, std::io::stdin(), &mut out) {
        0 => Ok(()),
        code => Err(Failure::runtime(format!("node agent ended with {code}"))),
    }
}
