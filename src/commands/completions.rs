//! `spark-kit completions <shell>`.

use clap::CommandFactory;

use super::Context;
use crate::cli::Cli;
use crate::error::Failure;

pub fn run(shell: clap_complete::Shell, ctx: &mut Context<'_>) -> Result<(), Failure> {
    clap_complete::generate(shell, &mut Cli::command(), "spark-kit", &mut ctx.out);
    Ok(())
}
