//! Line charts as PNG and SVG (plotters).
//!
//! plotters' default features draw text through fontconfig and freetype;
//! here text goes through `ab_glyph` with DejaVu Sans embedded in the binary
//! (the `dejavu` crate; Bitstream Vera license), so plots render the same on
//! a bare machine with no system fonts or C libraries.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::BenchError;

/// One curve.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend entry.
    pub label: String,
    /// Points in drawing order.
    pub points: Vec<(f64, f64)>,
    /// Draw a marker at every point (for sparse series).
    pub markers: bool,
}

/// One panel: axes and curves.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Caption above the panel.
    pub title: String,
    /// X axis description.
    pub x_label: String,
    /// Y axis description.
    pub y_label: String,
    /// Curves.
    pub series: Vec<Series>,
}

impl Series {
    /// The empirical CDF of `samples` as steps: (value, fraction ≤ value).
    pub fn cdf(label: impl Into<String>, samples: &[f64]) -> Series {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        // A step function: each sample raises the fraction by 1/n.
        let points = v
            .iter()
            .enumerate()
            .flat_map(|(i, x)| [(*x, i as f64 / n), (*x, (i + 1) as f64 / n)])
            .collect();
        Series {
            label: label.into(),
            points,
            markers: false,
        }
    }
}

const FONT: &str = "sans-serif";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The embedded font is valid; a failure would only lose text.
        if plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_err()
        {
            tracing::warn!("the embedded plot font failed to load");
        }
    });
}

/// A range covering `values` with a margin; `from_zero` pins the start at 0.
fn range(values: impl Iterator<Item = f64>, from_zero: bool) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
        hi = lo + lo.abs().max(1.0);
    }
    let pad = (hi - lo) * 0.05;
    let lo = if from_zero && lo >= 0.0 { lo } else { lo - pad };
    lo..hi + pad
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    chart: &Chart,
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let xs = range(
        chart
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0)),
        true,
    );
    let ys = range(
        chart
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1)),
        true,
    );
    let mut ctx = ChartBuilder::on(area)
        .caption(&chart.title, (FONT, 20))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(xs, ys)
        .map_err(err)?;
    ctx.configure_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(err)?;
    for (i, s) in chart.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        ctx.draw_series(LineSeries::new(
            s.points.iter().copied(),
            color.stroke_width(2),
        ))
        .map_err(err)?
        .label(s.label.as_str())
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        if s.markers {
            ctx.draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(err)?;
        }
    }
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 13))
        .draw()
        .map_err(err)?;
    Ok(())
}

fn draw_all<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    charts: &[Chart],
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((1, charts.len().max(1)));
    for (area, chart) in panels.iter().zip(charts) {
        draw_panel(area, chart)?;
    }
    root.present().map_err(|e| e.to_string())
}

/// Writes `charts` side by side to `<stem>.png` and `<stem>.svg`; returns
/// both paths.
pub fn write(stem: &Path, charts: &[Chart]) -> Result<[PathBuf; 2], BenchError> {
    register_font();
    let size = (640 * charts.len().max(1) as u32, 480);
    let png = stem.with_extension("png");
    let svg = stem.with_extension("svg");
    let fail = |path: &Path, message: String| BenchError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(message),
    };
    draw_all(BitMapBackend::new(&png, size).into_drawing_area(), charts)
        .map_err(|m| fail(&png, m))?;
    draw_all(SVGBackend::new(&svg, size).into_drawing_area(), charts).map_err(|m| fail(&svg, m))?;
    Ok([png, svg])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_is_monotone_and_ends_at_one() {
        let s = Series::cdf("x", &[3.0, 1.0, f64::NAN, 2.0]);
        let third = 1.0 / 3.0;
        assert_eq!(
            s.points,
            [
                (1.0, 0.0),
                (1.0, third),
                (2.0, third),
                (2.0, 2.0 * third),
                (3.0, 2.0 * third),
                (3.0, 1.0)
            ]
        );
    }

    #[test]
    fn ranges_have_room() {
        assert_eq!(range([].into_iter(), true), 0.0..1.0);
        let r = range([5.0, 5.0].into_iter(), true);
        assert!(r.start == 0.0 && r.end > 5.0);
        let r = range([-1.0, 1.0].into_iter(), false);
        assert!(r.start < -1.0 && r.end > 1.0);
    }

    #[test]
    fn writes_png_and_svg() {
        let dir = std::env::temp_dir().join(format!("ingot-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let chart = Chart {
            title: "TTFT CDF".into(),
            x_label: "TTFT (ms)".into(),
            y_label: "fraction of requests".into(),
            series: vec![
                Series::cdf("rate=1", &[10.0, 12.0, 15.0, 30.0]),
                Series {
                    label: "single point".into(),
                    points: vec![(20.0, 0.5)],
                    markers: true,
                },
            ],
        };
        let [png, svg] = write(&dir.join("cdf"), &[chart.clone(), chart]).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: width and height, big-endian, at bytes 16..24.
        let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
        let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
        assert_eq!((w, h), (1280, 480));
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("<svg") && text.contains("TTFT CDF"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
