//! `spark-kit verify --decode [--json]`: the structural audit, then a sampled decode of every
//! packed matrix with the Rust EXL3 decoder (`checkpoint::decode_check`).

use std::time::{Duration, Instant};

use super::io_failure;
use crate::checkpoint::decode_check::{decode_check, DecodeOptions};
use crate::checkpoint::exl3_audit::{num_hidden_layers, AuditReport};
use crate::checkpoint::text;
use crate::checkpoint::{Checkpoint, Origin};
use crate::cli::VerifyArgs;
use crate::error::Failure;

/// Seconds between progress lines on stderr.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Run the sampled decode after `audit` and report both; `k_map` (the kit's) gives the MTP
/// boundary for class names.
pub(super) fn run(
    args: &VerifyArgs,
    k_map: &std::collections::BTreeMap<String, f64>,
    ckpt: &Checkpoint,
    label: &str,
    audit: &AuditReport,
    ctx: &mut super::Context<'_>,
) -> Result<(), Failure> {
    let (blocks, json) = (args.decode_blocks, args.json);
    if matches!(ckpt.origin, Origin::Virtual { .. }) {
        return Err(Failure::usage("--decode needs checkpoint files; a virtual checkpoint has no data")
            .with_hint("pass --model DIR, or run `spark-kit download` first"));
    }
    if blocks == 0 {
        return Err(
            Failure::usage("--decode-blocks 0: nothing would be decoded").with_hint("use --decode-blocks 1 or more")
        );
    }
    let opts = DecodeOptions {
        blocks_per_matrix: blocks,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get().min(8)),
        num_hidden_layers: num_hidden_layers(k_map),
    };
    let started = Instant::now();
    // A status line on stderr every 5 s (worker threads report; ctx.err is not shared across them,
    // so this goes through the reporter, as `verify`'s hashing progress does).
    let every = crate::reporter::Every::new(PROGRESS_EVERY);
    let progress = |done: usize, total: usize| {
        every.tick(|| format!("verify: decoded samples of {done} of {total} packed matrices"));
    };
    let report = decode_check(ckpt, &opts, &progress)?;
    let seconds = started.elapsed().as_secs_f64();
    let text = if json {
        let mut v = serde_json::to_value(audit)?;
        let mut d = serde_json::to_value(&report)?;
        d["seconds"] = serde_json::json!(seconds);
        v["decode"] = d;
        serde_json::to_string_pretty(&v)?
    } else {
        format!("{}\n\n{}", text::audit(audit, label).trim_end(), text::decode(&report, seconds))
    };
    writeln!(ctx.out, "{}", text.trim_end()).map_err(|e| io_failure(&e))?;
    let structural = audit.errors();
    if let Some(first) = report.findings.first() {
        return Err(Failure::runtime(format!(
            "{} broken pack(s) found by decoding ({label}); first: {}",
            report.findings.len(),
            first.message
        ))
        .with_hint("re-download the shard holding the named tensor; if it persists the conversion itself is broken"));
    }
    if structural > 0 {
        return Err(Failure::runtime(format!("{structural} structural error(s) in the checkpoint ({label})"))
            .with_hint("a checkpoint with structural errors will not load; re-download the named shards"));
    }
    Ok(())
}
