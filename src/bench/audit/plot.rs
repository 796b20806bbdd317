//! The audit's plot: the decode rows (left, one column per row) and the prefill ladder (right,
//! log axis for prompt length), ours beside the published figure. Rows that did not run have no
//! point of ours.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{Audit, Kind, Row};
use crate::bench::plot::{axis_top, log_range, title, DrawError, Panels, LABEL_OFFSET, SIZE};
use crate::bench::result::BenchResult;
use crate::bench::sizes::length_label;

/// The audit's two panels (drawn by [`crate::bench::plot::draw`] for a result with an audit).
pub struct AuditPanels<'a> {
    pub r: &'a BenchResult,
    pub a: &'a Audit,
}

type Area<'a, DB> = DrawingArea<DB, Shift>;

impl Panels for AuditPanels<'_> {
    fn draw_on<DB: DrawingBackend>(&self, root: &Area<'_, DB>) -> Result<(), DrawError>
    where
        DB::ErrorType: 'static,
    {
        let (r, a) = (self.r, self.a);
        root.fill(&WHITE)?;
        let head = format!("audit: {} · {}", a.table, title(r));
        let root = root.titled(&head, ("sans-serif", 16))?;
        let (left, right) = root.split_horizontally(SIZE.0 / 2);
        let decode: Vec<&Row> = a.rows.iter().filter(|x| x.kind == Kind::Decode).collect();
        let prefill: Vec<&Row> = a.rows.iter().filter(|x| x.kind == Kind::Prefill).collect();
        decode_panel(&decode, &left)?;
        prefill_panel(&prefill, a.scale, &right)?;
        Ok(())
    }
}

#[allow(clippy::cast_precision_loss)]
fn decode_panel<DB: DrawingBackend>(
    rows: &[&Row],
    area: &Area<'_, DB>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let ours: Vec<(f64, f64)> = rows.iter().enumerate().filter_map(|(i, r)| Some((i as f64, r.ours?))).collect();
    let published: Vec<(f64, f64)> =
        rows.iter().enumerate().filter_map(|(i, r)| Some((i as f64, r.published?))).collect();
    let ids: Vec<String> = rows.iter().map(|r| r.id.replace("decode-", "").replace("-spec", "")).collect();
    let ymax = axis_top(ours.iter().chain(&published).map(|p| p.1), 1.2);
    let mut chart = ChartBuilder::on(area)
        .caption("Decode rows (tok/s/stream or aggregate, as published)", ("sans-serif", 16))
        .margin(15)
        .x_label_area_size(60)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..(rows.len() as f64 - 0.5), 0.0..ymax)?;
    chart
        .configure_mesh()
        .x_labels(rows.len().max(1))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() > 1e-6 || i < 0.0 {
                return String::new();
            }
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            ids.get(i as usize).cloned().unwrap_or_default()
        })
        .y_desc("tok/s")
        .draw()?;
    for (points, color, label) in [(&published, RGBColor(120, 120, 120), "published"), (&ours, BLUE, "ours")] {
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 5, color.filled())))?
            .label(label)
            .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
    }
    chart.draw_series(rows.iter().enumerate().filter_map(|(i, r)| {
        let y = r.ours?;
        Some(EmptyElement::at((i as f64, y)) + Text::new(format!("n={}", r.n), LABEL_OFFSET, ("sans-serif", 11)))
    }))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
}

#[allow(clippy::cast_precision_loss)]
fn prefill_panel<DB: DrawingBackend>(
    rows: &[&Row],
    scale: f64,
    area: &Area<'_, DB>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    // Both series at the published length, so a row's two points share an x.
    let at = |r: &Row| r.published_shape.prompt_tokens as f64;
    let ours: Vec<(f64, f64)> = rows.iter().filter_map(|r| Some((at(r), r.ours?))).collect();
    let published: Vec<(f64, f64)> = rows.iter().filter_map(|r| Some((at(r), r.published?))).collect();
    let (lo, hi) = log_range(rows.iter().map(|r| at(r)));
    let ymax = axis_top(ours.iter().chain(&published).map(|p| p.1), 1.2);
    let caption = if scale >= 1.0 {
        "Prefill ladder".to_string()
    } else {
        format!("Prefill ladder (ours ran at × {scale:.6} of each length)")
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..ymax)?;
    chart
        .configure_mesh()
        .x_desc("published prompt tokens (log)")
        .y_desc("prefill tok/s")
        .x_label_formatter(&|x| {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = x.round() as u64;
            length_label(n)
        })
        .draw()?;
    for (points, color, label) in [(&published, RGBColor(120, 120, 120), "published"), (&ours, GREEN, "ours")] {
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
}
