//! `spark-kit verify --decode [--json]`: the structural audit, then a sampled decode of every
//! packed matrix with the Rust EXL3 decoder (`checkpoint::decode_check`).

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::io_failure;
use crate::checkpoint::decode_check::{decode_check, DecodeOptions, DecodeReport};
use crate::checkpoint::exl3_audit::{num_hidden_layers, AuditReport};
use crate::checkpoint::{Checkpoint, Origin};
use crate::cli::VerifyArgs;
use crate::error::Failure;
use crate::kit::bytes::human_size as size;

/// Findings printed in the human report before "… and N more".
const MAX_SHOWN: usize = 40;
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
    let last = Mutex::new(started);
    // A status line on stderr every 5 s (worker threads report; ctx.err is not shared across them,
    // so this goes through the reporter, as `verify`'s hashing progress does).
    let progress = |done: usize, total: usize| {
        if let Ok(mut t) = last.lock() {
            if t.elapsed() >= PROGRESS_EVERY {
                *t = Instant::now();
                let line = format!("verify: decoded samples of {done} of {total} packed matrices\n");
                super::reporter::line(&line);
            }
        }
    };
    let report = decode_check(ckpt, &opts, &progress).map_err(|e| Failure::runtime(e.to_string()))?;
    let seconds = started.elapsed().as_secs_f64();
    let text = if json {
        let mut v = serde_json::to_value(audit).map_err(|e| Failure::runtime(e.to_string()))?;
        let mut d = serde_json::to_value(&report).map_err(|e| Failure::runtime(e.to_string()))?;
        d["seconds"] = serde_json::json!(seconds);
        v["decode"] = d;
        serde_json::to_string_pretty(&v).map_err(|e| Failure::runtime(e.to_string()))?
    } else {
        format!("{}\n\n{}", super::audit_text::human(audit, label).trim_end(), human(&report, seconds))
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

fn human(r: &DecodeReport, seconds: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "decode: {} packed matrices, {} block(s) of 128×128 each, {} tiles decoded, {} read in {seconds:.1} s",
        r.matrices,
        r.blocks_per_matrix,
        r.tiles_decoded,
        size(r.bytes_read)
    );
    let _ = writeln!(s, "\n{:<15} {:>8} {:>12} {:>12} {:>12}", "CLASS", "MATRICES", "W RMS MED", "MIN", "MAX");
    for (class, c) in &r.classes {
        let _ = writeln!(
            s,
            "{class:<15} {:>8} {:>12.3e} {:>12.3e} {:>12.3e}",
            c.matrices, c.median_w_rms, c.min_w_rms, c.max_w_rms
        );
    }
    for k in &r.skipped {
        let _ = writeln!(s, "skipped: {}", k.message);
    }
    if r.findings.is_empty() {
        let _ = writeln!(s, "\nno decode problems: every sampled weight is finite and sanely scaled");
    } else {
        let _ = writeln!(s);
        for f in r.findings.iter().take(MAX_SHOWN) {
            let _ = writeln!(s, "error: {}", f.message);
        }
        if r.findings.len() > MAX_SHOWN {
            let _ = writeln!(s, "… and {} more (see --json)", r.findings.len() - MAX_SHOWN);
        }
    }
    s
}
