//! The plot of one result: decode tok/s vs concurrency (left), prefill tok/s vs prompt length
//! (right). SVG or PNG by the file's extension.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::levels::levels;
use super::noise::step_trust;
use super::result::BenchResult;
use super::sizes::length_label;

/// Size of the image in pixels.
pub const SIZE: (u32, u32) = (1200, 500);

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("--plot {0}: the file name must end in .svg or .png")]
    Extension(String),
    #[error("cannot draw the plot: no TrueType font found (looked for DejaVu Sans, Liberation Sans, Noto Sans and any .ttf under {0})")]
    NoFont(String),
    #[error("cannot draw the plot {path}: {source}")]
    Draw {
        path: String,
        #[source]
        source: DrawError,
    },
}

/// A drawing backend's error, whichever backend drew (SVG: I/O, PNG: the bitmap encoder).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct DrawError(Box<dyn std::error::Error + Send + Sync>);

impl<E: std::error::Error + Send + Sync + 'static> From<DrawingAreaErrorKind<E>> for DrawError {
    fn from(e: DrawingAreaErrorKind<E>) -> Self {
        Self(Box::new(e))
    }
}

impl PlotError {
    #[must_use]
    pub fn hint(&self) -> &'static str {
        match self {
            Self::Extension(_) => "use e.g. --plot bench.svg or --plot bench.png",
            Self::NoFont(_) => "install a font (Debian: apt-get install fonts-dejavu-core)",
            Self::Draw { .. } => "check that the directory exists and is writable",
        }
    }
}

/// Output format of a plot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

/// The format from the extension (case-insensitive).
pub fn format_of(path: &Path) -> Result<Format, PlotError> {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("svg") => Ok(Format::Svg),
        Some("png") => Ok(Format::Png),
        _ => Err(PlotError::Extension(path.display().to_string())),
    }
}

const FONT_DIR: &str = "/usr/share/fonts";
const PREFERRED: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

fn any_ttf(dir: &Path, depth: u32) -> Option<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in &entries {
        if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
            return Some(p.clone());
        }
    }
    if depth == 0 {
        return None;
    }
    entries.iter().filter(|p| p.is_dir()).find_map(|p| any_ttf(p, depth - 1))
}

/// Register a system font as `sans-serif` once per process.
fn ensure_font() -> Result<(), PlotError> {
    static FONT: OnceLock<bool> = OnceLock::new();
    let ok = *FONT.get_or_init(|| {
        let path =
            PREFERRED.iter().map(PathBuf::from).find(|p| p.is_file()).or_else(|| any_ttf(Path::new(FONT_DIR), 4));
        let Some(bytes) = path.and_then(|p| std::fs::read(p).ok()) else { return false };
        // plotters keeps fonts for the life of the process: leaking one font file once is intended.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::NoFont(FONT_DIR.into()))
    }
}

/// Something that draws itself on a drawing area of any backend (SVG or PNG).
pub(crate) trait Panels {
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), DrawError>
    where
        DB::ErrorType: 'static;
}

/// Draw `panels` to `path`, SVG or PNG by its extension, [`SIZE`] pixels.
pub(crate) fn render(panels: &impl Panels, path: &Path) -> Result<(), PlotError> {
    let format = format_of(path)?;
    ensure_font()?;
    let drawn = match format {
        Format::Svg => {
            let root = SVGBackend::new(path, SIZE).into_drawing_area();
            panels.draw_on(&root).and_then(|()| Ok(root.present()?))
        }
        Format::Png => {
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            panels.draw_on(&root).and_then(|()| Ok(root.present()?))
        }
    };
    drawn.map_err(|source| PlotError::Draw { path: path.display().to_string(), source })
}

/// Draw `r` to `path` (SVG or PNG by extension); an audit result draws the audit's panels.
pub fn draw(r: &BenchResult, path: &Path) -> Result<(), PlotError> {
    match &r.audit {
        Some(a) => render(&super::audit::plot::AuditPanels { r, a }, path),
        None => render(&RunPanels(r), path),
    }
}

type Area<'a, DB> = DrawingArea<DB, Shift>;

struct RunPanels<'a>(&'a BenchResult);

impl Panels for RunPanels<'_> {
    fn draw_on<DB: DrawingBackend>(&self, root: &Area<'_, DB>) -> Result<(), DrawError>
    where
        DB::ErrorType: 'static,
    {
        let r = self.0;
        root.fill(&WHITE)?;
        let title = title(r);
        let root = root.titled(&title, ("sans-serif", 18))?;
        let (left, right) = root.split_horizontally(SIZE.0 / 2);
        decode_panel(r, &left)?;
        prefill_panel(r, &right)?;
        Ok(())
    }
}

/// The plot's title: model, kit, client host, versions and start time.
#[must_use]
pub fn title(r: &BenchResult) -> String {
    let rc = &r.receipt;
    format!(
        "{} · kit {} · host {} · spark-kit {} · server {} · {}",
        rc.model.id,
        rc.kit.as_ref().map_or("none (--url)", |k| k.name.as_str()),
        rc.host.hostname.as_deref().unwrap_or("unknown"),
        rc.spark_kit_version,
        rc.server_version.as_deref().map_or_else(|| "unknown".to_string(), |v| format!("vLLM {v}")),
        rc.started_at
    )
}

/// The top of a y axis: the largest value with `headroom` above it (1.0 when nothing is positive).
pub(crate) fn axis_top(values: impl Iterator<Item = f64>, headroom: f64) -> f64 {
    let m = values.fold(0.0_f64, f64::max);
    if m > 0.0 {
        m * headroom
    } else {
        1.0
    }
}

/// Pixels between a point and its label: right of and above the marker (radius 4), so the text
/// never covers the point it labels.
pub const LABEL_OFFSET: (i32, i32) = (7, -18);

/// The font of point labels.
fn label_font() -> FontDesc<'static> {
    ("sans-serif", 12).into_font()
}

/// A log axis range around the values: half the smallest to twice the largest (positive).
#[must_use]
pub fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.filter(|v| *v > 0.0).fold((f64::MAX, 0.0_f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi <= 0.0 {
        return (1.0, 10.0);
    }
    (lo / 2.0, hi * 2.0)
}

fn empty<DB: DrawingBackend>(area: &Area<'_, DB>, text: &str) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (w, h) = area.dim_in_pixel();
    area.draw(&Text::new(
        text.to_string(),
        (i32::try_from(w / 4).unwrap_or(0), i32::try_from(h / 2).unwrap_or(0)),
        ("sans-serif", 16),
    ))
}

fn decode_panel<DB: DrawingBackend>(
    r: &BenchResult,
    area: &Area<'_, DB>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let ls = levels(&r.decode);
    let per: Vec<(f64, f64)> =
        ls.iter().filter_map(|w| Some((f64::from(w.concurrency), w.decode_tok_s.as_ref()?.median))).collect();
    // Impossible rates (bench::plausible) are not plotted; the label says how many were left out.
    let per_n: Vec<String> = ls
        .iter()
        .filter_map(|w| {
            let n = w.decode_tok_s.as_ref()?.n;
            Some(if w.flagged.is_empty() { format!("n={n}") } else { format!("n={n}, {} flagged", w.flagged.len()) })
        })
        .collect();
    let agg: Vec<(f64, f64)> = ls.iter().filter_map(|w| Some((f64::from(w.concurrency), w.aggregate_tok_s?))).collect();
    if per.is_empty() && agg.is_empty() {
        return empty(area, "no decode measurements");
    }
    let xmax = r.decode.iter().map(|w| f64::from(w.concurrency)).fold(1.0, f64::max) + 1.0;
    let ymax = axis_top(per.iter().chain(&agg).map(|p| p.1), 1.15);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("Decode ({} tokens/stream)", r.settings.decode_tokens), ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..xmax, 0.0..ymax)?;
    chart
        .configure_mesh()
        .x_desc("concurrent streams")
        .y_desc("tok/s: (completion tokens − 1) / (last − first token)")
        .x_label_formatter(&|x| if x.fract() == 0.0 { format!("{x:.0}") } else { String::new() })
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    for (points, color, label) in [(&per, BLUE, "per stream (median)"), (&agg, RED, "aggregate")] {
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart.draw_series(
        per.iter().zip(&per_n).map(|(&p, n)| EmptyElement::at(p) + Text::new(n.clone(), LABEL_OFFSET, label_font())),
    )?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

#[allow(clippy::cast_precision_loss)]
fn prefill_panel<DB: DrawingBackend>(
    r: &BenchResult,
    area: &Area<'_, DB>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    // (x, rate, rated, ran, within noise) per measured length.
    let steps: Vec<(f64, f64, usize, usize, bool)> = r
        .prefill
        .iter()
        .filter_map(|p| {
            let t = step_trust(p, &r.calibration);
            Some((p.target_tokens as f64, p.prefill_tok_s.as_ref()?.median, t.rated, t.ran, t.within_noise))
        })
        .collect();
    let points: Vec<(f64, f64)> = steps.iter().map(|s| (s.0, s.1)).collect();
    if points.is_empty() {
        return empty(area, "no prefill measurements");
    }
    let (lo, hi) = log_range(points.iter().map(|p| p.0));
    let ymax = axis_top(points.iter().map(|p| p.1), 1.15);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("Prefill ({} per length)", r.settings.prefill_repeats), ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..ymax)?;
    chart
        .configure_mesh()
        .x_desc("prompt tokens")
        .y_desc("tok/s: (prompt − cached) / (TTFT − overhead)")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_label_formatter(&|x| {
            // Axis labels are rounded token counts.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = x.round() as u64;
            length_label(n)
        })
        .draw()?;
    chart.draw_series(LineSeries::new(points.iter().copied(), GREEN.stroke_width(2)))?;
    // Hollow = within noise (docs/bench.md): the rate divides jitter, not prefill time.
    chart.draw_series(
        steps.iter().map(|s| Circle::new((s.0, s.1), 4, if s.4 { GREEN.stroke_width(2) } else { GREEN.filled() })),
    )?;
    chart.draw_series(steps.iter().map(|s| {
        let label = format!("n={}/{}{}", s.2, s.3, if s.4 { " within noise" } else { "" });
        EmptyElement::at((s.0, s.1)) + Text::new(label, LABEL_OFFSET, label_font())
    }))?;
    Ok(())
}
