//! `spark-kit download`: the kit's model repo (every file) and Engram files into the HF cache,
//! verified, then the slim Engram directory and `spark-kit.lock`.

use std::time::Duration;

use super::hub_run::run_download;
use super::{io_failure, load, Context};
use crate::cli::{DownloadArgs, Only};
use crate::error::Failure;
use crate::hub::fetch::{Options, DEFAULT_JOURNAL_EVERY};
use crate::hub::kit_files::{record, requests, Part};
use crate::hub::retry::Backoff;
use crate::hub::run::Request;

pub fn run(args: &DownloadArgs, ctx: &mut Context<'_>) -> Result<(), Failure> {
    // --jobs, --range-size, --idle-timeout and --retries are checked by their value parsers (src/cli/values.rs).
    let s = load::settings_for(&args.kit, &ctx.env, crate::kit::validate::MODEL_ONLY)?;
    let only = args.only.map(|o| match o {
        Only::Model => Part::Model,
        Only::Engram => Part::Engram,
    });
    let repos = requests(&s.kit, only, &s.deploy.engram_dir)?;
    let opts = Options {
        jobs: args.jobs,
        range_size: args.range_size.bytes(),
        idle: Duration::from_secs(args.idle_timeout),
        backoff: Backoff { max_attempts: args.retries, ..Backoff::default() },
        journal_every: DEFAULT_JOURNAL_EVERY,
        transport: s.kit.model.transport,
    };
    let req = Request {
        hf_cache: s.deploy.hf_cache.clone(),
        repos,
        opts,
        dry_run: args.dry_run,
        verify_cached: args.verify_cached,
    };
    let reporter = crate::reporter::download::download(args.quiet);
    let summary = run_download(&req, &ctx.env, &s.deploy.dirs, reporter.clone())?;
    // Clears the bars before the summary is printed.
    drop(reporter);
    if !args.dry_run {
        record(&s.deploy.lock_file, &s.kit.name, &summary)?;
    }
    let text = if args.json {
        let mut v = serde_json::to_value(&summary)?;
        if !args.dry_run {
            v["lock_file"] = serde_json::Value::String(s.deploy.lock_file.display().to_string());
        }
        serde_json::to_string_pretty(&v)?
    } else {
        crate::hub::text::summary(&summary, &s.deploy.lock_file)
    };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))
}
