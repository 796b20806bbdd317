//! `spark-kit bench` and `spark-kit bench compare A.json B.json`.

use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{io_failure, load, Context};
use crate::bench::client::{BenchError, Endpoint};
use crate::bench::result::{self, BenchResult, KitReceipt, Request};
use crate::bench::run::{self, BenchReporter, Lengths, Plan};
use crate::bench::{compare, plot, sizes, table};
use crate::cli::{BenchArgs, BenchCommand, BenchRunArgs};
use crate::dirs::Dirs;
use crate::error::Failure;

pub fn run(args: &BenchArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    match &args.command {
        Some(BenchCommand::Compare { a, b, json }) => compare_files(a, b, *json, ctx),
        None => bench(&args.run, ctx),
    }
}

fn bench_failure(e: &BenchError) -> Failure {
    let f = match e {
        BenchError::BadUrl(_) | BenchError::TooLong(_) => Failure::usage(e.to_string()),
        _ => Failure::runtime(e.to_string()),
    };
    match e.hint() {
        Some(h) => f.with_hint(h),
        None => f,
    }
}

/// A parent directory that must exist before a long run, so the result is not lost at the end.
fn check_parent(flag: &str, path: &Path) -> Result<(), Failure> {
    if path == Path::new("-") {
        return Ok(());
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if parent.is_dir() {
        Ok(())
    } else {
        Err(Failure::usage(format!("{flag} {}: directory {} does not exist", path.display(), parent.display()))
            .with_hint("create the directory or pick another path"))
    }
}

fn api_key(args: &BenchRunArgs, kit: Option<&crate::kit::Kit>, ctx: &Context<'_>) -> Result<Option<String>, Failure> {
    if let Some(name) = &args.api_key_env {
        let v = ctx.env.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.trim().to_string());
        return match v.filter(|v| !v.is_empty()) {
            Some(v) => Ok(Some(first_key(&v))),
            None => Err(Failure::usage(format!("--api-key-env {name}: the variable is not set or empty"))
                .with_hint(format!("export {name}=<key>, or pass --api-key-file PATH"))),
        };
    }
    if let Some(path) = &args.api_key_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Failure::usage(format!("--api-key-file {}: {e}", path.display()))
                .with_hint("check the path and its permissions")
        })?;
        return match text.lines().map(str::trim).find(|l| !l.is_empty()) {
            Some(k) => Ok(Some(k.to_string())),
            None => Err(Failure::usage(format!("--api-key-file {}: the file is empty", path.display()))
                .with_hint("put the key on the first line")),
        };
    }
    match kit {
        Some(k) => crate::engine::endpoint::api_key(k, &ctx.env, &Dirs::from_env(&ctx.env))
            .map(|k| k.map(|k| first_key(&k)))
            .map_err(|e| {
                Failure::usage(e.to_string()).with_hint("fix the kit's engine.api_keys, or pass --api-key-env NAME")
            }),
        None => Ok(None),
    }
}

/// The first of comma-separated keys.
fn first_key(v: &str) -> String {
    v.split(',').map(str::trim).find(|k| !k.is_empty()).unwrap_or(v).to_string()
}

fn kit_hash(kit: &crate::kit::Kit) -> Result<String, Failure> {
    let bytes = serde_json::to_vec(kit).map_err(|e| Failure::runtime(format!("cannot hash the kit: {e}")))?;
    Ok(Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect())
}

fn bench(args: &BenchRunArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let concurrency = sizes::parse_concurrency(&args.concurrency).map_err(|e| {
        Failure::usage(format!("--concurrency {}: {e}", args.concurrency)).with_hint("use e.g. --concurrency 1,2,4")
    })?;
    let prefill = match &args.prefill {
        Some(p) => Some(sizes::parse_lengths(p).map_err(|e| {
            Failure::usage(format!("--prefill {p}: {e}")).with_hint("use e.g. --prefill 1k,8k,32k or --prefill none")
        })?),
        None => None,
    };
    // --timeout, --prefill-repeats, --decode-repeats, --decode-tokens, --decode-prompt-tokens and
    // --temperature are checked by their value parsers (src/cli/values.rs).
    if let Some(p) = &args.plot {
        plot::format_of(p).map_err(|e| Failure::usage(e.to_string()).with_hint(e.hint()))?;
        check_parent("--plot", p)?;
    }
    if let Some(j) = &args.json {
        check_parent("--json", j)?;
    }

    let resolved =
        if args.kit.kit.is_some() || args.url.is_none() { Some(load::settings(&args.kit, &ctx.env)?) } else { None };
    let kit = resolved.as_ref().map(|r| &r.kit);
    let url = match (&args.url, &resolved) {
        (Some(u), _) => u.clone(),
        (None, Some(s)) => s.ports.base_url(),
        // Unreachable by construction (no --url loads a kit); kept total for safety.
        (None, None) => return Err(Failure::usage("pass --url URL or --kit K")),
    };
    let model =
        args.model.clone().or_else(|| kit.map(|k| k.engine.served_model_name.clone()).filter(|m| !m.is_empty()));
    let key = api_key(args, kit, ctx)?;
    let kit_receipt = match &resolved {
        Some(r) => Some(KitReceipt { name: r.kit.name.clone(), sha256: kit_hash(&r.kit)? }),
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

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::runtime(format!("cannot start the async runtime: {e}")))?;
    if !args.quiet {
        let _ = writeln!(ctx.err, "==> bench: {}/v1", endpoint.base);
    }
    let mut rep = Progress { out: &mut *ctx.err, quiet: args.quiet };
    let result = rt.block_on(run::run(&endpoint, &plan, kit_receipt, &mut rep)).map_err(|e| bench_failure(&e))?;
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
    let json =
        serde_json::to_string_pretty(result).map_err(|e| Failure::runtime(format!("cannot encode the result: {e}")))?;
    let to_stdout = args.json.as_deref() == Some(Path::new("-"));
    if let Some(path) = args.json.as_deref().filter(|_| !to_stdout) {
        std::fs::write(path, format!("{json}\n")).map_err(|e| {
            // Keep the numbers: print them before failing.
            let _ = writeln!(ctx.out, "{json}");
            Failure::runtime(format!("--json {}: {e}", path.display()))
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
        plot::draw(result, p).map_err(|e| Failure::runtime(e.to_string()).with_hint(e.hint()))?;
        if !args.quiet {
            let _ = writeln!(ctx.err, "==> plot: {}", p.display());
        }
    }
    Ok(())
}

/// Progress lines on stderr.
struct Progress<'a> {
    out: &'a mut dyn std::io::Write,
    quiet: bool,
}

impl BenchReporter for Progress<'_> {
    fn phase(&mut self, name: &str, detail: &str) {
        if !self.quiet {
            let _ = writeln!(self.out, "==> {name}: {detail}");
        }
    }
    fn note(&mut self, message: &str) {
        let _ = writeln!(self.out, "note: {message}");
    }
    fn request(&mut self, phase: &str, outcome: Result<&Request, &str>) {
        match outcome {
            Ok(r) if !self.quiet => {
                // Only a decode stream's rate means something here: a prefill or calibration
                // request generates a handful of tokens, and its rate is the table's to compute.
                let decode = r
                    .decode_tok_s
                    .filter(|_| phase.starts_with("decode"))
                    .map_or_else(String::new, |d| format!(", decode {d:.1} tok/s/stream"));
                let _ = writeln!(
                    self.out,
                    "    {phase}: TTFT {:.0} ms, {} prompt + {} completion tokens{decode}",
                    r.ttft_s * 1000.0,
                    r.prompt_tokens,
                    r.completion_tokens
                );
            }
            Ok(_) => {}
            Err(e) => {
                let _ = writeln!(self.out, "    {phase}: FAILED: {e}");
            }
        }
    }
}

fn read_result(path: &Path) -> Result<BenchResult, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::usage(format!("{}: {e}", path.display()))
            .with_hint("pass two files written by `spark-kit bench --json`")
    })?;
    result::parse(&text).map_err(|e| {
        Failure::usage(format!("{}: {e}", path.display()))
            .caused_by_chain_of(&e)
            .with_hint("pass two files written by `spark-kit bench --json`")
    })
}

fn compare_files(a: &Path, b: &Path, json: bool, ctx: &mut Context<'_>) -> Result<(), Failure> {
    let ra = read_result(a)?;
    let rb = read_result(b)?;
    let rows = compare::rows(&ra, &rb);
    let text = if json {
        let v = serde_json::json!({"a": a.display().to_string(), "b": b.display().to_string(), "rows": rows});
        serde_json::to_string_pretty(&v).map_err(|e| Failure::runtime(e.to_string()))? + "\n"
    } else {
        compare::render(&a.display().to_string(), &b.display().to_string(), &ra, &rb, &rows)
    };
    write!(ctx.out, "{text}").map_err(|e| io_failure(&e))
}
