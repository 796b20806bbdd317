//! One file per subcommand: glue between the CLI and the library, no business logic.
//!
//! Commands write their output to the `out` they are given and return a [`Failure`] on error;
//! only `main.rs` touches the real stdout/stderr and exits.

pub mod bench;
pub mod cache_capped;
pub mod checkpoint_source;
mod classes;
pub mod completions;
pub mod config;
pub mod download;
pub mod engine;
pub mod guard;
pub mod hub_run;
pub mod image;
pub mod image_lock;
pub mod kits;
pub mod load;
pub mod logs;
pub mod node;
pub mod pack_engram;
pub mod plan;
pub mod preflight;
pub mod preflight_input;
pub mod setup;
pub mod status;
pub mod target;
pub mod up;
mod up_detach;
mod up_gateway;
mod up_prepare;
mod up_text;
pub mod verify;
pub mod verify_decode;

use std::io::Write;

use crate::cli::{Cli, Command, KitCommand};
use crate::error::Failure;

/// What a command needs from the outside world, passed in so tests can supply their own.
pub struct Context<'a> {
    /// The process environment as pairs (the only place it is read is `main`).
    pub env: Vec<(String, String)>,
    pub out: &'a mut dyn Write,
    /// Progress and human messages (stderr).
    pub err: &'a mut dyn Write,
    /// The command line as given (for re-running detached).
    pub args: Vec<String>,
}

/// Run the parsed command line.
pub fn run(cli: Cli, ctx: &mut Context<'_>) -> Result<(), Failure> {
    match cli.command {
        Command::Kits { json } => kits::list(json, ctx),
        Command::Kit(KitCommand::Show { kit }) => kits::show(kit.as_deref(), ctx),
        Command::Kit(KitCommand::Check { kit }) => kits::check(kit.as_deref(), ctx),
        Command::Config(args) => config::run(&args, ctx),
        Command::Setup(args) => setup::run(&args, ctx),
        Command::Up(args) => up::run(&args, ctx),
        Command::Status(args) => status::run(&args, ctx),
        Command::Logs(args) => logs::run(&args, ctx),
        Command::Down(args) => status::down(&args, ctx),
        Command::Restart(args) => up::restart(&args, ctx),
        Command::Node(args) => node::run(&args, ctx),
        Command::Engine(args) => engine::run(&args, ctx),
        Command::CacheCapped(args) => cache_capped::run(&args),
        Command::Download(args) => download::run(&args, ctx),
        Command::Verify(args) => verify::run(&args, ctx),
        Command::PackEngram(args) => pack_engram::run(&args, ctx),
        Command::Plan(args) => plan::run(&args, ctx),
        Command::Preflight(args) => preflight::run(&args, ctx),
        Command::Guard(args) => guard::run(&args, ctx),
        Command::Image(crate::cli::ImageCommand::Sync(args)) => image::sync(&args, ctx),
        Command::Image(crate::cli::ImageCommand::Build(args)) => image::build(&args, ctx),
        Command::Bench(args) => bench::run(&args, ctx),
        Command::Completions { shell } => completions::run(shell, ctx),
    }
}

/// Map an output error (closed pipe, full disk) to a runtime failure.
pub(crate) fn io_failure(e: &std::io::Error) -> Failure {
    Failure::runtime(format!("cannot write output: {e}"))
}
