//! `spark-kit bench` and `spark-kit bench compare A.json B.json`.

use std::path::Path;
use std::time::Duration;

use super::{io_failure, load, Context};
use crate::bench::client::{BenchError, Endpoint};
use crate::bench::key::{api_key, KeyFrom};
use crate::bench::lines::Lines;
use crate::bench::options::{self, Levels};
use crate::bench::result::{self, BenchResult, KitReceipt};
use crate::bench::run::{self, Lengths, Plan, Provenance};
use crate::bench::{audit, compare, plot, provenance, table};
use crate::cli::values::FlagError;
use crate::cli::{AuditTable, BenchArgs, BenchCommand, BenchRunArgs};
use crate::error::Failure;
use crate::kit::schema::SpecMethod;

pub fn run(args: &BenchArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    match &args.command {
        Some(BenchCommand::Compare { a, b, json }) => compare_files(a, b, *json, ctx),
        None => bench(&args.run, ctx),
    }
}

fn bench_failure(e: &BenchError) -> Failure {
    let f = if e.is_usage() { Failure::usage_error(e) } else { Failure::runtime_error(e) };
    f.with_hint_opt(e.hint())
}

fn bench(args: &BenchRunArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    // --timeout, --prefill-repeats, --decode-repeats, --decode-tokens, --decode-prompt-tokens and
    // --temperature are checked by their value parsers (src/cli/values.rs).
    let flag = |e: FlagError| Failure::usage(e.message).with_hint(e.hint);
    let Levels { concurrency, prefill } = options::levels(&args.concurrency, args.prefill.as_deref()).map_err(flag)?;
    options::check_outputs(args.plot.as_deref(), args.json.as_deref()).map_err(flag)?;

    let resolved =
        if args.kit.kit.is_some() || args.url.is_none() { Some(load::settings(&args.kit, &ctx.env)?) } else { None };
    let kit = resolved.as_ref().map(|r| &r.kit);
    let url = match (&args.url, &resolved) {
        (Some(u), _) => u.clone(),
        (None, Some(s)) => s.deploy.ports.base_url(),
        // Unreachable by construction (no --url loads a kit); kept total for safety.
        (None, None) => return Err(Failure::usage("pass --url URL or --kit K")),
    };
    let model =
        args.model.clone().or_else(|| kit.map(|k| k.engine.served_model_name.clone()).filter(|m| !m.is_empty()));
    let from =
        KeyFrom::of(args.api_key_env.as_deref(), args.api_key_file.as_deref(), resolved.as_ref().map(|s| &s.deploy));
    let key = api_key(&from, &ctx.env)?;
    let kit_receipt = match kit {
        Some(k) => Some(
            KitReceipt::of(k)
                .map_err(|e| Failure::runtime(format!("cannot hash the kit: {e}")).caused_by_chain_of(&e))?,
        ),
        None => None,
    };
    let endpoint = Endpoint::new(&url, key).map_err(|e| bench_failure(&e))?;
    let plan = Plan {
        model,
        concurrency,
        lengths: Lengths {
            decode_tokens: args.decode_tokens,
            decode_prompt_tokens: args.decode_prompt_tokens,
            prefill,
        },
        decode_repeats: args.decode_repeats,
        prefill_repeats: args.prefill_repeats,
        prefill_max_tokens: 8,
        calibration_prompt_tokens: 16,
        calibration_runs: 3,
        temperature: args.temperature,
        thinking: args.thinking,
        request_timeout: Duration::from_secs_f64(args.timeout),
    };

    if !args.quiet {
        let _ = writeln!(ctx.err, "==> bench: {}/v1", endpoint.base);
    }
    let mut rep = Lines { out: &mut *ctx.err, quiet: args.quiet };
    let provenance =
        Provenance { kit: kit_receipt, lock: resolved.as_ref().map(|s| provenance::lock_receipt(&s.deploy.lock_file)) };
    let result = match args.audit {
        Some(AuditTable::Reference) => {
            let speculates = kit.map(|k| k.engine.speculative.method != SpecMethod::None);
            audit::run::run_blocking(&endpoint, &plan, provenance, speculates, &mut rep)
        }
        None => run::run_blocking(&endpoint, &plan, provenance, &mut rep),
    }
    .map_err(|e| bench_failure(&e))?;
    write_outputs(args, &result, ctx)?;
    if result.failures.is_empty() {
        Ok(())
    } else {
        Err(Failure::runtime(format!(
            "{} request(s) failed; the measurements of the others are kept",
            result.failures.len()
        ))
        .with_hint("see the failures listed above (and in the JSON); check the server's log"))
    }
}

fn write_outputs(args: &BenchRunArgs, result: &BenchResult, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let json = serde_json::to_string_pretty(result)
        .map_err(|e| Failure::runtime(format!("cannot encode the result: {e}")).caused_by_chain_of(&e))?;
    let to_stdout = args.json.as_deref() == Some(Path::new("-"));
    if let Some(path) = args.json.as_deref().filter(|_| !to_stdout) {
        std::fs::write(path, format!("{json}\n")).map_err(|e| {
            // Keep the numbers: print them before failing.
            let _ = writeln!(ctx.out, "{json}");
            Failure::runtime(format!("--json {}: {e}", path.display()))
                .caused_by_chain_of(&e)
                .with_hint("the JSON result was printed on stdout instead")
        })?;
        if !args.quiet {
            let _ = writeln!(ctx.err, "==> result: {}", path.display());
        }
    }
    if to_stdout {
        writeln!(ctx.out, "{json}").map_err(|e| io_failure(&e))?;
    } else {
        write!(ctx.out, "{}", table::render(result)).map_err(|e| io_failure(&e))?;
    }
    if let Some(p) = &args.plot {
        plot::draw(result, p)?;
        if !args.quiet {
            let _ = writeln!(ctx.err, "==> plot: {}", p.display());
        }
    }
    Ok(())
}

fn read_result(path: &Path) -> Result<BenchResult, Failure> {
    result::read(path)
        .map_err(|e| Failure::usage_error(&e).with_hint("pass two files written by `spark-kit bench --json`"))
}

fn compare_files(a: &Path, b: &Path, json: bool, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let ra = read_result(a)?;
    let rb = read_result(b)?;
    let rows = compare::rows(&ra, &rb);
    let (a, b) = (a.display().to_string(), b.display().to_string());
    let text = if json {
        serde_json::to_string_pretty(&compare::json(&a, &b, &rows))? + "\n"
    } else {
        compare::render(&a, &b, &ra, &rb, &rows)
    };
    write!(ctx.out, "{text}").map_err(|e| io_failure(&e))
}
