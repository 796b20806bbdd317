//! The reference kit's published table (../shared/docs/reference-kit.md §D, its maintainer's
//! measurements with the sparkDash client) as rows, and the scale that fits it to a small kit.
//! Pure.

use super::{Kind, Metric, Row, Shape};

/// Where the numbers were published.
pub const SOURCE: &str = "reference kit (MiaAI-Lab DeepSeek-v4.1-Flash-EXL3-2x-DGX-Sparks), docs/reference-kit.md §D";

/// The longest published prompt (the 601k prefill and long-context decode rows), tokens.
pub const LONGEST: u64 = 601_000;
/// Kits whose max_model_len reaches this run the table as published (rows longer than the model
/// are skipped, saying why); smaller ones run it scaled so that [`LONGEST`] fits.
pub const FULL_SIZE: u64 = 131_072;
/// Room kept beside the longest scaled prompt for its output and prompt-fitting slack.
const ROOM: u64 = 32;
/// No scaled token count goes below this.
pub const MIN_TOKENS: u64 = 16;

/// The published decode shape: sparkDash's 256-token prompt; 256 tokens out.
const DECODE_PROMPT: u64 = 256;
const DECODE_OUT: u64 = 256;
/// Prefill requests ask for 8 tokens (sparkDash).
const PREFILL_OUT: u64 = 8;
/// The chat sent during a long prefill: 17 tokens.
const CHAT_TOKENS: u64 = 17;

/// The scale for a model of `max_model_len` (None = unknown: as published) and why.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn scale_for(max_model_len: Option<u64>) -> (f64, String) {
    match max_model_len {
        Some(m) if m < FULL_SIZE => {
            let f = m.saturating_sub(ROOM) as f64 / LONGEST as f64;
            (
                f,
                format!(
                    "max_model_len {m} < {FULL_SIZE}: every token count × ({m} − {ROOM}) / {LONGEST} = {f:.6} (at least \
                     {MIN_TOKENS}), so the longest published prompt fits"
                ),
            )
        }
        Some(m) => (1.0, format!("max_model_len {m} ≥ {FULL_SIZE}: the shapes as published")),
        None => (1.0, "max_model_len unknown: the shapes as published".into()),
    }
}

/// A token count scaled (rounded, at least [`MIN_TOKENS`]; unchanged at scale 1).
#[must_use]
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn scaled(tokens: u64, scale: f64) -> u64 {
    if scale >= 1.0 {
        return tokens;
    }
    ((tokens as f64 * scale).round() as u64).max(MIN_TOKENS)
}

fn shape(concurrency: u32, prompt_tokens: u64, output_tokens: u64) -> Shape {
    Shape { concurrency, prompt_tokens, output_tokens }
}

struct Spec {
    id: &'static str,
    label: &'static str,
    kind: Kind,
    metric: Metric,
    speculation: Option<bool>,
    shape: Shape,
    published: Option<f64>,
    text: &'static str,
}

#[allow(clippy::too_many_lines)]
fn specs() -> Vec<Spec> {
    let decode = |id, label, c, spec, metric, published, text| Spec {
        id,
        label,
        kind: Kind::Decode,
        metric,
        speculation: Some(spec),
        shape: shape(c, DECODE_PROMPT, DECODE_OUT),
        published,
        text,
    };
    let mut v = vec![
        decode(
            "decode-x1-spec-on",
            "decode x1, speculation on",
            1,
            true,
            Metric::PerStream,
            Some(31.6),
            "31.6 (TTFT 221 ms)",
        ),
        decode(
            "decode-x2-spec-on",
            "decode x2, speculation on",
            2,
            true,
            Metric::Aggregate,
            Some(42.5),
            "42.5 agg (21.6/stream, TTFT 347 ms)",
        ),
        decode("decode-x4-spec-on", "decode x4, speculation on", 4, true, Metric::Aggregate, Some(42.8), "42.8 agg"),
        decode("decode-x1-spec-off", "decode x1, speculation off", 1, false, Metric::PerStream, Some(23.0), "23"),
        decode("decode-x2-spec-off", "decode x2, speculation off", 2, false, Metric::Aggregate, None, "not published"),
        decode("decode-x4-spec-off", "decode x4, speculation off", 4, false, Metric::Aggregate, Some(53.7), "53.7 agg"),
    ];
    let prefill = |id, label, n, published, text| Spec {
        id,
        label,
        kind: Kind::Prefill,
        metric: Metric::Prefill,
        speculation: None,
        shape: shape(1, n, PREFILL_OUT),
        published: Some(published),
        text,
    };
    v.extend([
        prefill("prefill-8k", "prefill 8k", 8192, 970.8, "970.8 (TTFT 8.46 s)"),
        prefill("prefill-16k", "prefill 16k", 16_384, 986.9, "986.9 (16.62 s)"),
        prefill("prefill-32k", "prefill 32k", 32_768, 1054.7, "1,054.7 (31.09 s)"),
        prefill("prefill-64k", "prefill 64k", 65_536, 1022.7, "1,022.7 (64.10 s)"),
        prefill("prefill-100k", "prefill 100k", 100_000, 979.0, "979 (102 s)"),
        prefill("prefill-128k", "prefill 128k", 131_072, 961.3, "961.3 (136.37 s)"),
        prefill("prefill-181k", "prefill 181k", 181_000, 948.0, "948"),
        prefill("prefill-256k", "prefill 256k", 262_144, 872.6, "872.6 (300.44 s)"),
        prefill("prefill-455k", "prefill 455k", 455_000, 802.0, "802 (567 s)"),
        prefill("prefill-601k", "prefill 601k", LONGEST, 810.0, "810 (742 s)"),
    ]);
    let long = |id, label, n, published, text| Spec {
        id,
        label,
        kind: Kind::Decode,
        metric: Metric::PerStream,
        speculation: None,
        shape: shape(1, n, DECODE_OUT),
        published: Some(published),
        text,
    };
    v.extend([
        long("long-decode-100k", "long-context decode at 100k", 100_000, 19.2, "19.0–19.4"),
        long("long-decode-455k", "long-context decode at 455k", 455_000, 24.0, "24.0"),
        long("long-decode-601k", "long-context decode at 601k", LONGEST, 22.3, "22.3"),
    ]);
    v.push(Spec {
        id: "chat-during-181k-prefill",
        label: "17-token chat during a 181k prefill",
        kind: Kind::ChatDuringPrefill,
        metric: Metric::TtftS,
        speculation: None,
        shape: shape(1, 181_000, PREFILL_OUT),
        published: Some(3.6),
        text: "3.6 s (216 s without the long-prefill threshold)",
    });
    v
}

/// The short chat's prompt length in a chat-during-prefill row (not scaled: it is already short).
#[must_use]
pub fn chat_tokens() -> u64 {
    CHAT_TOKENS
}

/// The rows of the reference table at `scale`, not yet run.
#[must_use]
pub fn reference_rows(scale: f64) -> Vec<Row> {
    specs()
        .into_iter()
        .map(|s| Row {
            id: s.id.into(),
            label: s.label.into(),
            kind: s.kind,
            metric: s.metric,
            speculation: s.speculation,
            published_shape: s.shape,
            shape: Shape {
                concurrency: s.shape.concurrency,
                prompt_tokens: scaled(s.shape.prompt_tokens, scale),
                output_tokens: if s.kind == Kind::Decode {
                    scaled(s.shape.output_tokens, scale)
                } else {
                    s.shape.output_tokens
                },
            },
            published: s.published,
            published_text: s.text.into(),
            ours: None,
            n: 0,
            min: None,
            max: None,
            ms_per_step: None,
            spec_decode: None,
            skipped: None,
            note: None,
            waves: Vec::new(),
            requests: Vec::new(),
        })
        .collect()
}

/// Why a row cannot run with this engine and model (None = it can).
#[must_use]
pub fn cannot_run(row: &Row, speculating: Option<bool>, max_model_len: Option<u64>) -> Option<String> {
    if let Some(want) = row.speculation {
        match speculating {
            None => {
                return Some(
                    "cannot tell whether the engine speculates (its /metrics did not answer and no --kit says): \
                     pass --kit or expose /metrics"
                        .into(),
                )
            }
            Some(on) if on != want => {
                return Some(if on {
                    "the engine in use speculates: restart it with --set engine.speculative.method=none to run this row"
                        .into()
                } else {
                    "the engine in use does not speculate: restart it with speculation on (engine.speculative) to run \
                     this row"
                        .into()
                })
            }
            Some(_) => {}
        }
    }
    let need = row.shape.prompt_tokens + row.shape.output_tokens;
    match max_model_len {
        Some(m) if need > m => Some(format!(
            "{} prompt + {} output tokens exceed the model's max_model_len {m}",
            row.shape.prompt_tokens, row.shape.output_tokens
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_kits_scale_so_the_longest_row_fits_and_full_kits_run_as_published() {
        let (f, why) = scale_for(Some(512));
        assert!((f - 480.0 / 601_000.0).abs() < 1e-12, "{f}");
        assert!(why.contains("max_model_len 512 < 131072"), "{why}");
        let rows = reference_rows(f);
        assert_eq!(rows.len(), 6 + 10 + 3 + 1);
        for r in &rows {
            assert!(r.shape.prompt_tokens + r.shape.output_tokens <= 512, "{} {:?}", r.id, r.shape);
            assert!(r.shape.prompt_tokens >= MIN_TOKENS, "{}", r.id);
            assert_eq!(cannot_run(r, Some(r.speculation.unwrap_or(true)), Some(512)), None, "{}", r.id);
        }
        let p601 = rows.iter().find(|r| r.id == "prefill-601k").unwrap();
        assert_eq!((p601.published_shape.prompt_tokens, p601.shape.prompt_tokens), (601_000, 480));
        assert_eq!(scale_for(Some(600_000)).0, 1.0);
        assert_eq!(scaled(455_000, 1.0), 455_000);
    }

    #[test]
    fn a_row_that_cannot_run_says_why() {
        let rows = reference_rows(1.0);
        let off = rows.iter().find(|r| r.id == "decode-x1-spec-off").unwrap();
        assert!(cannot_run(off, Some(true), None).unwrap().contains("engine.speculative.method=none"));
        assert!(cannot_run(off, None, None).unwrap().contains("cannot tell whether the engine speculates"));
        let on = rows.iter().find(|r| r.id == "decode-x2-spec-on").unwrap();
        assert!(cannot_run(on, Some(false), None).unwrap().contains("does not speculate"));
        let p601 = rows.iter().find(|r| r.id == "prefill-601k").unwrap();
        assert_eq!(
            cannot_run(p601, Some(true), Some(600_000)).unwrap(),
            "601000 prompt + 8 output tokens exceed the model's max_model_len 600000"
        );
        // Rows without a speculation need run either way.
        assert_eq!(cannot_run(p601, None, Some(614_400)), None);
    }
}
