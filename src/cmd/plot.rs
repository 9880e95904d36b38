//! `p2ptrain plot`: training curves of one or more runs, read from their `metrics.jsonl` (see
//! `metrics`), drawn into one SVG or PNG figure of four panels:
//!
//! ```text
//! training loss  vs iteration  | training loss  vs wall time
//! test accuracy  vs iteration  | test accuracy  vs wall time
//! ```
//!
//! Runs are overlaid, one colour each, labelled by the directory of their metrics file (or
//! `--label`). Test lines carry no clock of their own: a test point is placed in time by
//! interpolating the train lines' `elapsed_s` over iterations (a test at iteration `k` runs after
//! `k` iterations are done). Text is drawn with the DejaVu Sans font embedded in the binary
//! (`assets/fonts/`), so PNG output needs no system font.

use crate::error::{Error, Result};
use crate::input_file::{read_regular, UNBOUNDED};
use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// One `{"phase": "train"}` line: the displayed loss after iteration `iter`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainPoint {
    pub iter: u64,
    pub loss: f64,
    /// Seconds since training started, when the line was written.
    pub elapsed_s: f64,
}

/// One `{"phase": "test"}` line: a test pass before iteration `iter` (after `iter` iterations).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TestPoint {
    pub iter: u64,
    pub loss: f64,
    pub accuracy: Option<f64>,
    /// Seconds since training started, when the file records it.
    pub elapsed_s: Option<f64>,
}

/// The curves of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub label: String,
    pub train: Vec<TrainPoint>,
    pub test: Vec<TestPoint>,
}

/// What `p2ptrain plot` draws, and where.
#[derive(Debug, Clone)]
pub struct PlotOptions {
    /// `metrics.jsonl` files, or run directories holding one.
    pub inputs: Vec<PathBuf>,
    /// Labels for the first inputs, in order; the others are named after their directory.
    pub labels: Vec<String>,
    /// The figure: `.svg` or `.png`.
    pub output: PathBuf,
    /// Logarithmic loss axis.
    pub log_loss: bool,
}

/// The figure's format, from the output's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// `.svg` or `.png` (any case); anything else is a usage error.
    pub fn of(path: &Path) -> Result<Format> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        match ext.as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => Err(Error::Usage(format!(
                "{}: unknown figure format (the output must end in .svg or .png)",
                path.display()
            ))),
        }
    }
}

/// Figure size in pixels (SVG user units).
pub const SIZE: (u32, u32) = (1280, 960);

/// Runs `p2ptrain plot`; returns the process exit code (0, 2 for bad input, 1 for I/O).
pub fn run(opts: &PlotOptions) -> i32 {
    match plot(opts) {
        Ok(()) => {
            println!("wrote {}", opts.output.display());
            0
        }
        Err(e) => {
            eprintln!("p2ptrain: error: {e}");
            e.exit_code()
        }
    }
}

/// Reads every input and draws the figure.
pub fn plot(opts: &PlotOptions) -> Result<()> {
    let format = Format::of(&opts.output)?;
    if opts.labels.len() > opts.inputs.len() {
        return Err(Error::Usage(format!(
            "{} --label given for {} metrics file(s)",
            opts.labels.len(),
            opts.inputs.len()
        )));
    }
    let runs = opts
        .inputs
        .iter()
        .enumerate()
        .map(|(i, p)| read_run(p, opts.labels.get(i).cloned()))
        .collect::<Result<Vec<_>>>()?;
    draw(&runs, &opts.output, format, opts.log_loss)
}

/// Reads a run from `path` (a `metrics.jsonl`, or a directory holding one), labelled `label` or
/// after the file's directory.
pub fn read_run(path: &Path, label: Option<String>) -> Result<Run> {
    let file = if path.is_dir() {
        path.join("metrics.jsonl")
    } else {
        path.to_path_buf()
    };
    let bytes = read_regular(&file, UNBOUNDED).map_err(|e| Error::data(&file, e))?;
    let text =
        String::from_utf8(bytes).map_err(|e| Error::data(&file, format!("not UTF-8: {e}")))?;
    let (train, test) = parse_metrics(&text, &file)?;
    if train.is_empty() && test.is_empty() {
        return Err(Error::data(&file, "holds no train or test line"));
    }
    let label = label.unwrap_or_else(|| default_label(&file));
    Ok(Run { label, train, test })
}

/// The name of the directory holding `file` (`runs/a/metrics.jsonl` → `a`).
fn default_label(file: &Path) -> String {
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let dir = dir.canonicalize().unwrap_or(dir);
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| file.display().to_string())
}

/// Parses the lines of a `metrics.jsonl`. Blank lines and lines of other phases are skipped;
/// anything else that is not a train or test line is an error naming `file:line`.
pub fn parse_metrics(text: &str, file: &Path) -> Result<(Vec<TrainPoint>, Vec<TestPoint>)> {
    let (mut train, mut test) = (Vec::new(), Vec::new());
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |msg: String| Error::data(format!("{}:{}", file.display(), i + 1), msg);
        let v: Value = serde_json::from_str(line).map_err(|e| at(format!("not JSON: {e}")))?;
        let Some(obj) = v.as_object() else {
            return Err(at("not a JSON object".into()));
        };
        let num = |key: &str| -> Result<f64> {
            obj.get(key)
                .and_then(Value::as_f64)
                .ok_or_else(|| at(format!("`{key}` is missing or not a number")))
        };
        let iter = obj
            .get("iter")
            .and_then(Value::as_u64)
            .ok_or_else(|| at("`iter` is missing or not a non-negative integer".into()))?;
        match obj.get("phase").and_then(Value::as_str) {
            Some("train") => train.push(TrainPoint {
                iter,
                loss: num("loss")?,
                elapsed_s: num("elapsed_s")?,
            }),
            Some("test") => test.push(TestPoint {
                iter,
                loss: num("loss")?,
                accuracy: obj.get("accuracy").map(|_| num("accuracy")).transpose()?,
                elapsed_s: obj.get("elapsed_s").map(|_| num("elapsed_s")).transpose()?,
            }),
            Some(_) => {}
            None => return Err(at("`phase` is missing or not a string".into())),
        }
    }
    Ok((train, test))
}

/// Seconds since the start at which `iters` iterations were done, interpolated (and past the
/// last train line, extrapolated at the last rate) from the train lines; `None` without them.
pub fn time_at(train: &[TrainPoint], iters: u64) -> Option<f64> {
    // A train line of iteration i is written after i + 1 iterations; 0 iterations at 0 s.
    let knots = std::iter::once((0.0, 0.0))
        .chain(train.iter().map(|p| ((p.iter + 1) as f64, p.elapsed_s)))
        .collect::<Vec<_>>();
    if knots.len() < 2 {
        return None;
    }
    let x = iters as f64;
    let seg = knots
        .windows(2)
        .find(|w| x <= w[1].0)
        .unwrap_or(&knots[knots.len() - 2..]);
    let ((x0, t0), (x1, t1)) = (seg[0], seg[1]);
    if x1 <= x0 {
        return Some(t1);
    }
    Some((t0 + (x - x0) * (t1 - t0) / (x1 - x0)).max(0.0))
}

/// A series of one run in one panel.
struct Series {
    label: String,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// Distinct colours (Tableau 10), reused cyclically.
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The four panels' series: (loss vs iter, loss vs time, accuracy vs iter, accuracy vs time).
fn series(runs: &[Run], log_loss: bool) -> [Vec<Series>; 4] {
    let mut out: [Vec<Series>; 4] = Default::default();
    for (i, run) in runs.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mk = |points: Vec<(f64, f64)>| Series {
            label: run.label.clone(),
            color,
            points,
        };
        let loss = run
            .train
            .iter()
            .filter(|p| p.loss.is_finite() && (!log_loss || p.loss > 0.0));
        out[0].push(mk(loss.clone().map(|p| (p.iter as f64, p.loss)).collect()));
        out[1].push(mk(loss.map(|p| (p.elapsed_s, p.loss)).collect()));
        let acc = run
            .test
            .iter()
            .filter_map(|p| p.accuracy.filter(|a| a.is_finite()).map(|a| (p, a)));
        out[2].push(mk(acc.clone().map(|(p, a)| (p.iter as f64, a)).collect()));
        out[3].push(mk(acc
            .filter_map(|(p, a)| {
                p.elapsed_s
                    .or_else(|| time_at(&run.train, p.iter))
                    .map(|t| (t, a))
            })
            .collect()));
    }
    for panel in &mut out {
        for s in panel.iter_mut() {
            s.points = s.points.iter().filter_map(|&p| on_axes(p)).collect();
        }
    }
    out
}

/// Largest magnitude drawn: a coordinate beyond it is drawn at it, so that an axis's span, its
/// padding and its ticks stay finite (a loss of ±1e308 would make them infinite).
const AXIS_LIMIT: f64 = 1e300;

/// `(x, y)` clamped to ±[`AXIS_LIMIT`]; `None` when either is NaN.
fn on_axes((x, y): (f64, f64)) -> Option<(f64, f64)> {
    let clamp = |v: f64| (!v.is_nan()).then(|| v.clamp(-AXIS_LIMIT, AXIS_LIMIT));
    Some((clamp(x)?, clamp(y)?))
}

/// The range of `values` (padded when empty or a single value).
fn extent(values: impl Iterator<Item = f64>) -> Option<Range<f64>> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if lo > hi {
        return None;
    }
    if lo == hi {
        let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        return Some(lo - pad..hi + pad);
    }
    Some(lo..hi)
}

fn xs(s: &[Series]) -> Option<Range<f64>> {
    extent(s.iter().flat_map(|s| s.points.iter().map(|p| p.0)))
}

fn ys(s: &[Series]) -> Option<Range<f64>> {
    extent(s.iter().flat_map(|s| s.points.iter().map(|p| p.1)))
}

/// Draws the figure and writes it to `path` (see [`write_figure`]).
pub fn draw(runs: &[Run], path: &Path, format: Format, log_loss: bool) -> Result<()> {
    let bytes = render(runs, format, log_loss).map_err(|e| {
        Error::io(
            format!("drawing {}", path.display()),
            std::io::Error::other(e),
        )
    })?;
    write_figure(path, &bytes)
}

/// The figure's bytes in `format`, drawn in memory.
fn render(runs: &[Run], format: Format, log_loss: bool) -> std::result::Result<Vec<u8>, String> {
    register_font();
    match format {
        Format::Svg => {
            let mut svg = String::new();
            {
                let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
                draw_on(&root, runs, log_loss).map_err(|e| e.to_string())?;
                root.present().map_err(|e| e.to_string())?;
            }
            Ok(svg.into_bytes())
        }
        Format::Png => {
            let (w, h) = SIZE;
            let mut rgb = vec![0u8; w as usize * h as usize * 3];
            {
                let root = BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area();
                draw_on(&root, runs, log_loss).map_err(|e| e.to_string())?;
                root.present().map_err(|e| e.to_string())?;
            }
            encode_png(&rgb, SIZE).map_err(|e| e.to_string())
        }
    }
}

/// `rgb` (8-bit RGB, row-major, `size` pixels) as a PNG file.
fn encode_png(rgb: &[u8], size: (u32, u32)) -> std::result::Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, size.0, size.1);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(out)
}

/// Writes the figure's `bytes` to `path`, every write checked: through a temporary file next to
/// it, synced and renamed over it, so that a full disk leaves the old file (or none), never a
/// truncated one. An existing `path` that is not a regular file (a device, a FIFO) is written
/// in place.
fn write_figure(path: &Path, bytes: &[u8]) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => std::fs::write(path, bytes)
            .map_err(|e| Error::io(format!("writing figure {}", path.display()), e)),
        _ => crate::snapshot::write_atomic(path, "figure", |tmp| std::fs::write(tmp, bytes)),
    }
}

type DrawResult<DB> =
    std::result::Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn draw_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[Run],
    log_loss: bool,
) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let panels = root.split_evenly((2, 2));
    let [loss_iter, loss_time, acc_iter, acc_time] = series(runs, log_loss);
    let loss_y = ys(&loss_iter);
    let acc_y = ys(&acc_iter).map(|r| (r.start - 0.02).max(0.0)..(r.end + 0.02).min(1.0));
    // Panels of one column share their x axis, so that loss and accuracy line up.
    let union = |a: Option<Range<f64>>, b: Option<Range<f64>>| match (a, b) {
        (Some(a), Some(b)) => Some(a.start.min(b.start)..a.end.max(b.end)),
        (a, b) => a.or(b),
    };
    let iter_x = union(xs(&loss_iter), xs(&acc_iter));
    let time_x = union(xs(&loss_time), xs(&acc_time));
    let cells = [
        (
            &panels[0],
            "Training loss",
            "iteration",
            &loss_iter,
            &iter_x,
            &loss_y,
            true,
        ),
        (
            &panels[1],
            "Training loss",
            "wall time (s)",
            &loss_time,
            &time_x,
            &loss_y,
            true,
        ),
        (
            &panels[2],
            "Test accuracy",
            "iteration",
            &acc_iter,
            &iter_x,
            &acc_y,
            false,
        ),
        (
            &panels[3],
            "Test accuracy",
            "wall time (s)",
            &acc_time,
            &time_x,
            &acc_y,
            false,
        ),
    ];
    for (area, title, xlabel, series, x, y, is_loss) in cells {
        let (Some(x), Some(y), false) = (
            x.clone(),
            y.clone(),
            series.iter().all(|s| s.points.is_empty()),
        ) else {
            empty_panel(area, title, xlabel)?;
            continue;
        };
        let ylabel = if is_loss { "loss" } else { "accuracy" };
        if is_loss && log_loss {
            let y = (y.start * 0.9)..(y.end * 1.1);
            let ticks = log_ticks(y.start, y.end);
            let y = y.log_scale().with_key_points(ticks);
            panel(area, title, xlabel, ylabel, x, y, series)?;
        } else {
            let pad = if is_loss {
                0.05 * (y.end - y.start)
            } else {
                0.0
            };
            let y = (y.start - pad).max(if is_loss { 0.0 } else { f64::MIN })..y.end + pad;
            panel(area, title, xlabel, ylabel, x, y, series)?;
        }
    }
    Ok(())
}

/// A panel with no data (no run has test accuracy, say): its title and a note.
fn empty_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    xlabel: &str,
) -> DrawResult<DB> {
    let area = area.titled(&format!("{title} vs {xlabel}"), ("sans-serif", 22))?;
    let (w, h) = area.dim_in_pixel();
    let style = TextStyle::from(("sans-serif", 18).into_font())
        .color(&RGBColor(110, 110, 110))
        .pos(plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Center,
        ));
    area.draw_text("(no data)", &style, (w as i32 / 2, h as i32 / 2))
}

/// One panel: a line per series, dots at the points, a legend of the run labels.
fn panel<DB: DrawingBackend, Y>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    x: Range<f64>,
    y: Y,
    series: &[Series],
) -> DrawResult<DB>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{title} vs {xlabel}"), ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc(xlabel)
        .y_desc(ylabel)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(RGBColor(246, 246, 246))
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .draw()?;
    for s in series.iter().filter(|s| !s.points.is_empty()) {
        let color = s.color;
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(&s.label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        if s.points.len() <= 60 {
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .position(if ylabel == "loss" {
            SeriesLabelPosition::UpperRight
        } else {
            SeriesLabelPosition::LowerRight
        })
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .label_font(("sans-serif", 15))
        .draw()
}

/// Ticks of a logarithmic axis over `lo..hi` (0 < lo < hi): 1, 2, 5 × 10^k, or every
/// 1..9 × 10^k when that gives fewer than three (a range within one decade), or evenly spaced
/// round values when even that gives fewer than three (a narrow range).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let within = |mantissas: &[f64]| -> Vec<f64> {
        let (k0, k1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        (k0..=k1)
            .flat_map(|k| mantissas.iter().map(move |m| m * 10f64.powi(k)))
            .filter(|v| (lo..=hi).contains(v))
            .collect()
    };
    let coarse = within(&[1.0, 2.0, 5.0]);
    if coarse.len() >= 3 {
        return coarse;
    }
    let fine = within(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    if fine.len() >= 3 {
        return fine;
    }
    // A round step (1, 2 or 5 × 10^k) giving about five ticks.
    let raw = (hi - lo) / 5.0;
    let unit = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * unit)
        .find(|&st| st >= raw)
        .unwrap_or(10.0 * unit);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

/// An axis tick: at most four significant digits, no trailing zeros (`0.30000000000000004` → `0.3`),
/// in scientific notation from a million on (`2e299`, not three hundred digits).
fn tick(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    if v.abs() >= 1e6 {
        let s = format!("{v:.3e}");
        let (mantissa, exponent) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        return format!("{mantissa}e{exponent}");
    }
    let digits = (3 - v.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Registers the embedded font as `sans-serif` (once per process).
fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
        // The font is a fixed, valid TrueType file: registration cannot fail at run time.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"iter":0,"phase":"train","loss":2.3,"lr":0.1,"samples_per_sec":100.0,"elapsed_s":0.5}
{"iter":9,"phase":"train","loss":1.1,"lr":0.1,"samples_per_sec":100.0,"elapsed_s":2.0}

{"iter":10,"phase":"test","loss":1.0,"accuracy":0.75}
{"iter":10,"phase":"resume","from":"x"}
{"iter":20,"phase":"test","loss":0.9}
"#;

    #[test]
    fn train_and_test_lines_are_read_and_other_phases_skipped() {
        let (train, test) = parse_metrics(GOOD, Path::new("m.jsonl")).unwrap();
        assert_eq!(
            train,
            vec![
                TrainPoint {
                    iter: 0,
                    loss: 2.3,
                    elapsed_s: 0.5
                },
                TrainPoint {
                    iter: 9,
                    loss: 1.1,
                    elapsed_s: 2.0
                }
            ]
        );
        assert_eq!(test.len(), 2);
        assert_eq!(test[0].accuracy, Some(0.75));
        assert_eq!(test[1].accuracy, None);
        assert_eq!(test[1].loss, 0.9);
    }

    fn error_of(text: &str) -> String {
        let e = parse_metrics(text, Path::new("runs/a/metrics.jsonl")).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        e.to_string()
    }

    #[test]
    fn a_malformed_line_is_named_by_file_and_line() {
        let e =
            error_of("{\"iter\":0,\"phase\":\"train\",\"loss\":1,\"elapsed_s\":1}\n{\"iter\":1,");
        assert!(e.starts_with("runs/a/metrics.jsonl:2: not JSON"), "{e}");
        let e = error_of("\n\n{\"iter\":0,\"phase\":\"train\",\"elapsed_s\":1}\n");
        assert!(e.starts_with("runs/a/metrics.jsonl:3: `loss`"), "{e}");
        let e = error_of("{\"iter\":-1,\"phase\":\"test\",\"loss\":1}");
        assert!(e.contains(":1: `iter`"), "{e}");
        let e = error_of("{\"iter\":1,\"loss\":1}");
        assert!(e.contains(":1: `phase`"), "{e}");
        let e = error_of("[1, 2]");
        assert!(e.contains(":1: not a JSON object"), "{e}");
        let e = error_of("{\"iter\":1,\"phase\":\"test\",\"loss\":1,\"accuracy\":\"high\"}");
        assert!(e.contains(":1: `accuracy`"), "{e}");
    }

    #[test]
    fn a_missing_file_is_named_and_exits_2() {
        let e = read_run(Path::new("/nonexistent/run/metrics.jsonl"), None).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.to_string().contains("/nonexistent/run/metrics.jsonl"),
            "{e}"
        );
    }

    #[test]
    fn the_label_is_the_directory_name_unless_given() {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("lr0.1");
        std::fs::create_dir(&run_dir).unwrap();
        std::fs::write(run_dir.join("metrics.jsonl"), GOOD).unwrap();
        let run = read_run(&run_dir.join("metrics.jsonl"), None).unwrap();
        assert_eq!(run.label, "lr0.1");
        assert_eq!(read_run(&run_dir, None).unwrap().label, "lr0.1");
        let run = read_run(&run_dir, Some("baseline".into())).unwrap();
        assert_eq!(run.label, "baseline");
    }

    #[test]
    fn a_log_axis_has_ticks_even_within_one_decade() {
        assert_eq!(log_ticks(0.05, 3.0), vec![0.05, 0.1, 0.2, 0.5, 1.0, 2.0]);
        let narrow = log_ticks(0.75, 2.5);
        let want = [0.8, 0.9, 1.0, 2.0];
        assert_eq!(narrow.len(), want.len(), "{narrow:?}");
        for (t, w) in narrow.iter().zip(want) {
            assert!((t - w).abs() < 1e-12, "{narrow:?}");
        }
        let tight = log_ticks(1.7, 2.6);
        let want = [1.8, 2.0, 2.2, 2.4, 2.6];
        assert_eq!(tight.len(), want.len(), "{tight:?}");
        for (t, w) in tight.iter().zip(want) {
            assert!((t - w).abs() < 1e-9, "{tight:?}");
        }
    }

    #[test]
    fn ticks_have_few_digits() {
        assert_eq!(tick(0.30000000000000004), "0.3");
        assert_eq!(tick(0.7999999999999999), "0.8");
        assert_eq!(tick(1500.0), "1500");
        assert_eq!(tick(0.0125), "0.0125");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(2e299), "2e299");
        assert_eq!(tick(-1.25e7), "-1.25e7");
        assert_eq!(tick(999_999.0), "999999");
    }

    #[test]
    fn only_svg_and_png_are_known_formats() {
        assert_eq!(Format::of(Path::new("a.svg")).unwrap(), Format::Svg);
        assert_eq!(Format::of(Path::new("a.PNG")).unwrap(), Format::Png);
        for bad in ["a.pdf", "a", "svg"] {
            let e = Format::of(Path::new(bad)).unwrap_err();
            assert_eq!(e.exit_code(), 2);
            assert!(e.to_string().contains(".svg or .png"), "{e}");
        }
    }

    #[test]
    fn test_points_are_placed_in_time_from_the_train_clock() {
        let train = [
            TrainPoint {
                iter: 9,
                loss: 1.0,
                elapsed_s: 2.0,
            },
            TrainPoint {
                iter: 19,
                loss: 1.0,
                elapsed_s: 6.0,
            },
        ];
        assert_eq!(time_at(&train, 0), Some(0.0));
        assert_eq!(time_at(&train, 5), Some(1.0));
        assert_eq!(time_at(&train, 10), Some(2.0));
        assert_eq!(time_at(&train, 15), Some(4.0));
        // Past the last train line: the last rate, 0.4 s per iteration.
        assert_eq!(time_at(&train, 30), Some(10.0));
        assert_eq!(time_at(&[], 3), None);
    }
}
