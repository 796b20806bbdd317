//! spark-kit binary: parse the command line, run the command, map errors to exit codes.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use spark_kit::cli::values::FlagError;
use spark_kit::cli::Cli;
use spark_kit::commands::{self, Context};
use spark_kit::error::Failure;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => match flag_failure(&e) {
            // A value refused by a flag's value parser: the same `error:` / `hint:` as any failure.
            Some(f) => return fail(&f),
            None => e.exit(),
        },
    };
    let env: Vec<(String, String)> =
        std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect();
    // Not locked for the whole run: background threads of `up` print the ready banner.
    let mut out = std::io::stdout();
    let mut err_out = std::io::stderr();
    let args: Vec<String> = std::env::args().collect();
    let mut ctx = Context { env, out: &mut out, err: &mut err_out, args };
    let result = commands::run(cli, &mut ctx);
    let _ = out.flush();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => fail(&f),
    }
}

/// Rendered once, here: `error:` / `caused by:` (the `#[source]` chain) / `hint:`.
fn fail(f: &Failure) -> ExitCode {
    let _ = std::io::stderr().lock().write_all(f.render().as_bytes());
    ExitCode::from(f.code as u8)
}

/// The failure for a value one of the value parsers in `cli::values` refused (exit 2).
fn flag_failure(e: &clap::Error) -> Option<Failure> {
    use std::error::Error as _;
    let refused = e.source()?.downcast_ref::<FlagError>()?;
    Some(Failure::usage(refused.message.clone()).with_hint(refused.hint.clone()))
}
