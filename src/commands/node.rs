//! `spark-kit node --rank N` (hidden): the node agent. Events on stdout, commands on stdin.

use super::Context;
use crate::cli::NodeArgs;
use crate::cluster::agent::{self, JsonLines};
use crate::error::{ExitCode, Failure};

pub fn run(args: &NodeArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let mut out = JsonLines(std::io::stdout());
    match agent::run(args.rank, &ctx.env, std::io::stdin(), &mut out) {
        0 => Ok(()),
        code => Err(Failure { code: ExitCode::Runtime, message: format!("node agent ended with {code}"), hint: None }),
    }
}
