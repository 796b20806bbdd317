//! Running the audit's rows against the endpoint: decode waves (with the spec-decode counters),
//! prefill steps, and a short chat sent while a long prompt is prefilled.

use std::time::Duration;

use super::published::{cannot_run, chat_tokens, reference_rows, scale_for, SOURCE};
use super::{Audit, Kind, Metric, Row};
use crate::bench::client::{BenchError, Endpoint};
use crate::bench::levels::levels;
use crate::bench::metrics::{median, summarize};
use crate::bench::noise::{overhead_spread_s, step_trust};
use crate::bench::result::BenchResult;
use crate::bench::run::{prefill_timeout, BenchReporter, Plan, Provenance};
use crate::bench::runner::Session;
use crate::bench::sizes::length_label;

/// Delay between sending the long prompt and the short chat of a chat-during-prefill row.
pub const CHAT_DELAY: Duration = Duration::from_millis(10);

/// [`run`] on a runtime of its own.
pub fn run_blocking(
    ep: &Endpoint,
    plan: &Plan,
    provenance: Provenance,
    kit_speculates: Option<bool>,
    rep: &mut dyn BenchReporter,
) -> Result<BenchResult, BenchError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(BenchError::Runtime)?;
    rt.block_on(run(ep, plan, provenance, kit_speculates, rep))
}

/// Replay the reference table. `kit_speculates` is the kit's word when `/metrics` says nothing.
pub async fn run(
    ep: &Endpoint,
    plan: &Plan,
    provenance: Provenance,
    kit_speculates: Option<bool>,
    rep: &mut dyn BenchReporter,
) -> Result<BenchResult, BenchError> {
    let mut s = Session::open(ep, plan, rep).await?;
    let max = s.model.max_model_len;
    let (scale, scale_why) = scale_for(max);
    rep.phase("audit", &format!("{SOURCE}; {scale_why}"));
    let _ = s.runner.spec_counts().await;
    let speculating = s.runner.spec_counters.or(kit_speculates);
    let mut rows = reference_rows(scale);
    for row in &mut rows {
        if let Some(why) = cannot_run(row, speculating, max) {
            rep.note(&format!("{}: not run: {why}", row.label));
            row.skipped = Some(why);
            continue;
        }
        match row.kind {
            Kind::Decode => decode_row(&mut s, row, rep).await?,
            Kind::Prefill => prefill_row(&mut s, row, rep).await?,
            Kind::ChatDuringPrefill => chat_row(&mut s, row, rep).await?,
        }
        if row.ours.is_none() && row.skipped.is_none() {
            let flagged: usize = levels(&row.waves).iter().map(|l| l.flagged.len()).sum();
            row.skipped = Some(format!(
                "no sample gave a figure ({flagged} impossible stream rate(s) flagged; failed requests are listed below)"
            ));
        }
    }
    let audit =
        Audit { table: "reference".into(), source: SOURCE.into(), scale, scale_why, speculation: speculating, rows };
    Ok(s.finish(provenance, Vec::new(), Vec::new(), Some(audit)))
}

async fn decode_row(s: &mut Session<'_>, row: &mut Row, rep: &mut dyn BenchReporter) -> Result<(), BenchError> {
    let c = row.shape.concurrency;
    rep.phase(
        "audit",
        &format!(
            "{}: {c} stream(s) × {} tokens, prompt {} tokens",
            row.label, row.shape.output_tokens, row.shape.prompt_tokens
        ),
    );
    for _ in 0..s.runner.plan.decode_repeats.max(1) {
        let mut reqs = Vec::new();
        for _ in 0..c {
            reqs.push(s.runner.request_for(row.shape.prompt_tokens, row.shape.output_tokens).await?);
        }
        row.waves.push(s.runner.wave(c, reqs, rep).await);
    }
    let Some(level) = levels(&row.waves).into_iter().next() else { return Ok(()) };
    let counters = s.runner.spec_counters;
    row.ms_per_step = level.ms_per_step(counters);
    row.spec_decode = level.spec;
    match row.metric {
        Metric::Aggregate => {
            let aggs: Vec<f64> = row.waves.iter().filter_map(|w| w.aggregate_tok_s).collect();
            fill(row, &aggs);
        }
        _ => {
            if let Some(d) = level.decode_tok_s {
                (row.ours, row.n, row.min, row.max) = (Some(d.median), d.n, Some(d.min), Some(d.max));
            }
        }
    }
    Ok(())
}

async fn prefill_row(s: &mut Session<'_>, row: &mut Row, rep: &mut dyn BenchReporter) -> Result<(), BenchError> {
    let (max, overhead) = (s.model.max_model_len, s.calibration.overhead_s);
    let step = s.runner.prefill(row.shape.prompt_tokens, max, overhead, rep).await?;
    if let Some(p) = &step.prefill_tok_s {
        (row.ours, row.n, row.min, row.max) = (Some(p.median), p.n, Some(p.min), Some(p.max));
    }
    let trust = step_trust(&step, &s.calibration);
    let overhead_ms = overhead * 1e3;
    row.skipped = step.skipped.clone().or_else(|| {
        (trust.ran > 0 && trust.rated == 0).then(|| {
            format!(
                "{} request(s) ran, none with a TTFT above the {overhead_ms:.0} ms overhead: no prefill time left to divide by",
                trust.ran
            )
        })
    });
    if trust.within_noise {
        row.note = Some(format!(
            "within noise: median TTFT − overhead is not above the overhead's own spread of {:.0} ms; the rate can be \
             off by 2x or more",
            overhead_spread_s(&s.calibration) * 1e3
        ));
    }
    row.requests = step.requests;
    Ok(())
}

/// The long prompt is sent, then after [`CHAT_DELAY`] the short chat; the chat's TTFT counts
/// only if its first token came before the long prompt's (the prefill was still running).
async fn chat_row(s: &mut Session<'_>, row: &mut Row, rep: &mut dyn BenchReporter) -> Result<(), BenchError> {
    let long_tokens = row.shape.prompt_tokens;
    rep.phase(
        "audit",
        &format!("{}: a {}-token chat {CHAT_DELAY:?} after a {}-token prompt", row.label, chat_tokens(), long_tokens),
    );
    let long = s.runner.request_for(long_tokens, row.shape.output_tokens).await?;
    let chat = s.runner.request_for(chat_tokens(), row.shape.output_tokens).await?;
    let (ep, epoch) = (s.runner.ep.clone(), s.runner.epoch);
    let long_timeout = prefill_timeout(long_tokens);
    let chat_timeout = s.runner.plan.request_timeout;
    let long_task = tokio::spawn({
        let ep = ep.clone();
        async move { ep.stream_chat(&long, epoch, long_timeout).await }
    });
    tokio::time::sleep(CHAT_DELAY).await;
    let chat_out = ep.stream_chat(&chat, epoch, chat_timeout).await;
    let long_out = long_task
        .await
        .unwrap_or_else(|e| Err(crate::bench::client::RequestError::Stream(format!("request task failed: {e}"))));
    let phase = format!("chat during prefill {}", length_label(long_tokens));
    let (long_rec, chat_rec) = match (long_out, chat_out) {
        (Ok(l), Ok(c)) => (crate::bench::runner::request_record(&l), crate::bench::runner::request_record(&c)),
        (Err(e), _) | (_, Err(e)) => {
            s.runner.fail(&phase, &e, rep);
            row.skipped = Some(format!("a request failed: {e}"));
            return Ok(());
        }
    };
    rep.request(&phase, Ok(&chat_rec));
    if chat_rec.first_s < long_rec.first_s {
        fill(row, &[chat_rec.ttft_s]);
    } else {
        row.skipped = Some(format!(
            "the {}-token prompt was prefilled {:.0} ms before the chat's first token: too short on this kit to overlap \
             a chat",
            long_rec.prompt_tokens,
            (chat_rec.first_s - long_rec.first_s) * 1e3
        ));
    }
    row.requests = vec![long_rec, chat_rec];
    Ok(())
}

/// `ours` = the median of the values, with n and spread.
fn fill(row: &mut Row, values: &[f64]) {
    if let Some(sm) = summarize(values) {
        (row.ours, row.n, row.min, row.max) = (median(values), sm.n, Some(sm.min), Some(sm.max));
    }
}
