//! Figures (SVG, drawn with plotters; text is left to the SVG viewer, so no
//! font is read from the system):
//!
//! * CDFs of TTFT and response time: per grid point of a sweep, pooled over
//!   its seeds (`plots/cdf_ttft.svg`, `plots/cdf_response.svg`), or of one
//!   run (`pdsim run --plots DIR`).
//! * Time series of one run (`timeseries.svg`, and the numbers in
//!   `timeseries.csv`): each decoder's KV usage (held ÷ capacity), each
//!   prefiller's held KV tokens (leases included), and the queues (requests
//!   waiting for admission on each prefiller; on each decoder, new requests
//!   waiting plus remote ones whose KV has arrived). Sampled every
//!   `--sample-interval` simulated seconds by a system that runs after
//!   [`crate::SimSystems::Observe`]: the value at a sample time is the state the
//!   last tick at or before it left.
//!
//! CDFs are drawn from log-binned histograms ([`LogHistogram`], 100 bins per
//! decade: 2.3 % wide), which a sweep keeps beside every run, so that the
//! pooled CDF of a resumed or merged sweep is exactly that of one run
//! through.

use bevy_ecs::prelude::*;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::engine::{Engine, KvPool};
use crate::error::{Error, Result};
use crate::metrics::report::write_atomic;
use crate::shared::{Clock, EngineIndex};
use crate::stats::Histogram;

/// Bins per decade of [`LogHistogram`].
pub const BINS_PER_DECADE: u32 = 100;

/// Counts of positive values in logarithmic bins: bin `b` holds
/// `[10^(b/k), 10^((b+1)/k))`, `k` bins per decade. Histograms add exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogHistogram {
    pub bins_per_decade: u32,
    pub count: u64,
    /// Values ≤ 0 (none expected: times are positive).
    pub nonpositive: u64,
    pub bins: BTreeMap<i32, u64>,
}

impl Default for LogHistogram {
    fn default() -> Self {
        LogHistogram {
            bins_per_decade: BINS_PER_DECADE,
            count: 0,
            nonpositive: 0,
            bins: BTreeMap::new(),
        }
    }
}

impl LogHistogram {
    /// The values of `h` (each at its bucket's lower edge: within 0.05 %,
    /// well inside a 2.3 % bin) in 100 bins per decade.
    pub fn of(h: &Histogram) -> LogHistogram {
        let mut out = LogHistogram {
            count: h.count(),
            nonpositive: h.zeros(),
            ..LogHistogram::default()
        };
        let k = out.bins_per_decade as f64;
        for (x, n) in h.buckets() {
            *out.bins.entry((x.log10() * k).floor() as i32).or_default() += n;
        }
        out
    }

    pub fn add(&mut self, other: &LogHistogram) {
        assert_eq!(self.bins_per_decade, other.bins_per_decade);
        self.count += other.count;
        self.nonpositive += other.nonpositive;
        for (b, n) in &other.bins {
            *self.bins.entry(*b).or_default() += n;
        }
    }

    fn edge(&self, b: i32) -> f64 {
        10f64.powf(b as f64 / self.bins_per_decade as f64)
    }

    /// The CDF at bin edges: (x, fraction of values below x).
    pub fn cdf(&self) -> Vec<(f64, f64)> {
        let Some((&first, _)) = self.bins.iter().next() else {
            return Vec::new();
        };
        let n = self.count as f64;
        let mut cum = self.nonpositive;
        let mut pts = vec![(self.edge(first), cum as f64 / n)];
        for (&b, &c) in &self.bins {
            cum += c;
            pts.push((self.edge(b + 1), cum as f64 / n));
        }
        pts
    }
}

/// The TTFT and response distributions of one run, for CDFs pooled over seeds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunDistributions {
    pub ttft: LogHistogram,
    #[serde(default)]
    pub tpot: LogHistogram,
    #[serde(default)]
    pub itl: LogHistogram,
    #[serde(alias = "response")]
    pub e2e: LogHistogram,
}

impl RunDistributions {
    /// The distributions of one run's observations.
    pub fn of(o: &crate::metrics::PhaseObservations) -> RunDistributions {
        use crate::metrics::Obs;
        RunDistributions {
            ttft: LogHistogram::of(o.get(Obs::Ttft)),
            tpot: LogHistogram::of(o.get(Obs::Tpot)),
            itl: LogHistogram::of(o.get(Obs::Itl)),
            e2e: LogHistogram::of(o.get(Obs::E2e)),
        }
    }

    /// The four, with their names and titles, for figures.
    pub fn named(&self) -> [(&'static str, &'static str, &LogHistogram); 4] {
        [
            ("ttft", "TTFT", &self.ttft),
            ("tpot", "TPOT", &self.tpot),
            ("itl", "ITL", &self.itl),
            ("e2e", "end-to-end latency", &self.e2e),
        ]
    }

    pub fn add(&mut self, other: &RunDistributions) {
        self.ttft.add(&other.ttft);
        self.tpot.add(&other.tpot);
        self.itl.add(&other.itl);
        self.e2e.add(&other.e2e);
    }
}

fn draw_err<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> Error + '_ {
    move |e| Error::new(format!("cannot draw {what}: {e}"))
}

/// A labelled curve: (x, y) points.
pub type Curve = (String, Vec<(f64, f64)>);

/// Draws CDFs into an SVG file (see [`cdf_svg_text`]).
pub fn cdf_svg(path: &Path, title: &str, curves: &[Curve]) -> Result<()> {
    write_atomic(path, &cdf_svg_text(title, curves)?)
}

/// CDFs as SVG text, one line per curve, on a logarithmic time axis.
pub fn cdf_svg_text(title: &str, curves: &[Curve]) -> Result<String> {
    // The x axis is log10 of the value, labelled with the value itself: a
    // log scale that still reads when the data span less than a decade.
    let xs = curves
        .iter()
        .flat_map(|(_, c)| c.iter().map(|p| p.0))
        .filter(|&x| x > 0.0);
    let (lo, hi) = xs.fold((f64::INFINITY, 0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo.log10(), hi.log10())
    } else {
        (-3.0, 0.0)
    };
    let pad = (hi - lo) * 0.02;
    let (lo, hi) = (lo - pad, hi + pad);
    let mut svg = String::new();
    {
        let err = draw_err(title);
        let root = SVGBackend::with_string(&mut svg, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(lo..hi, 0f64..1f64)
            .map_err(&err)?;
        chart
            .configure_mesh()
            .x_label_formatter(&|v| sig3(10f64.powf(*v)))
            .x_desc("seconds (log scale)")
            .y_desc("fraction of requests")
            .draw()
            .map_err(&err)?;
        for (i, (label, pts)) in curves.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    pts.iter()
                        .filter(|p| p.0 > 0.0)
                        .map(|&(x, y)| (x.log10(), y)),
                    color.stroke_width(2),
                ))
                .map_err(&err)?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(&err)?;
        root.present().map_err(&err)?;
    }
    Ok(svg)
}

/// Three significant digits, for axis labels.
fn sig3(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let mag = x.abs().log10().floor() as i32;
    if !(-4..6).contains(&mag) {
        return format!("{x:.2e}");
    }
    let decimals = (2 - mag).max(0) as usize;
    format!("{x:.decimals$}")
}

/// A metric against a grid axis as SVG text: the median over seeds as a
/// line, the range (min–max) as a band; `points` are (axis value, median,
/// min, max), placed evenly in their order.
pub fn band_svg_text(
    title: &str,
    axis: &str,
    unit: &str,
    points: &[(String, f64, f64, f64)],
) -> Result<String> {
    let hi = points
        .iter()
        .map(|p| p.3)
        .fold(0f64, f64::max)
        .max(f64::MIN_POSITIVE);
    let n = points.len().max(1);
    let mut svg = String::new();
    {
        let err = draw_err(title);
        let root = SVGBackend::with_string(&mut svg, (640, 400)).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..hi * 1.08)
            .map_err(&err)?;
        let labels: Vec<String> = points.iter().map(|p| p.0.clone()).collect();
        chart
            .configure_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                    labels[i as usize].clone()
                } else {
                    String::new()
                }
            })
            .x_desc(axis)
            .y_desc(unit)
            .draw()
            .map_err(&err)?;
        let band: Vec<(f64, f64)> = points
            .iter()
            .enumerate()
            .map(|(i, p)| (i as f64, p.3))
            .chain(
                points
                    .iter()
                    .enumerate()
                    .rev()
                    .map(|(i, p)| (i as f64, p.2)),
            )
            .collect();
        chart
            .draw_series(std::iter::once(Polygon::new(band, BLUE.mix(0.18).filled())))
            .map_err(&err)?;
        chart
            .draw_series(LineSeries::new(
                points.iter().enumerate().map(|(i, p)| (i as f64, p.1)),
                BLUE.stroke_width(2),
            ))
            .map_err(&err)?;
        chart
            .draw_series(
                points
                    .iter()
                    .enumerate()
                    .map(|(i, p)| Circle::new((i as f64, p.1), 3, BLUE.filled())),
            )
            .map_err(&err)?;
        root.present().map_err(&err)?;
    }
    Ok(svg)
}

// ---------------------------------------------------------------------------
// Time series of one run

/// Samples of engine state at regular simulated times.
#[derive(Resource, Debug, Clone)]
pub struct SeriesRecorder {
    pub interval: f64,
    pub horizon: f64,
    /// Column names; the first `decoders` are KV usage, the next
    /// `prefillers` held KV tokens, then queues.
    pub columns: Vec<String>,
    pub decoders: usize,
    pub prefillers: usize,
    pub times: Vec<f64>,
    pub rows: Vec<Vec<f64>>,
    next: u64,
    last: Vec<f64>,
}

impl SeriesRecorder {
    /// Emits every sample time before `now` (`or_at`: up to and including
    /// it) with the state the last tick left.
    fn emit(&mut self, now: f64, or_at: bool) {
        loop {
            let t = self.next as f64 * self.interval;
            if t > self.horizon || t > now || (t == now && !or_at) {
                return;
            }
            self.times.push(t);
            self.rows.push(self.last.clone());
            self.next += 1;
        }
    }
}

/// The system: before this tick's state replaces the last, the sample
/// times it passed get the last state.
pub fn series_system(
    clock: Res<Clock>,
    index: Res<EngineIndex>,
    engines: Query<(&Engine, &KvPool)>,
    mut rec: ResMut<SeriesRecorder>,
) {
    rec.emit(clock.now, false);
    let mut row = Vec::with_capacity(rec.columns.len());
    for &e in &index.decode {
        let (_, kv) = engines.get(e).expect("decoder");
        row.push(kv.0.num_held() as f64 / kv.0.num_blocks() as f64);
    }
    for &e in &index.prefill {
        let (_, kv) = engines.get(e).expect("prefiller");
        row.push((kv.0.num_held() * kv.0.block_size()) as f64);
    }
    for &e in &index.prefill {
        let (eng, _) = engines.get(e).expect("prefiller");
        row.push(eng.waiting.len() as f64);
    }
    for &e in &index.decode {
        let (eng, _) = engines.get(e).expect("decoder");
        row.push((eng.waiting.len() + eng.ready.len()) as f64);
    }
    rec.last = row;
}

impl SeriesRecorder {
    /// A recorder of the engines of `index`, every `interval` simulated
    /// seconds up to `horizon` ([`crate::Sim::record_series`] adds it).
    pub fn new(index: &EngineIndex, interval: f64, horizon: f64) -> SeriesRecorder {
        let (np, nd) = (index.prefill.len(), index.decode.len());
        let mut columns = Vec::new();
        columns.extend((0..nd).map(|j| format!("decode{j}_kv_usage")));
        columns.extend((0..np).map(|i| format!("prefill{i}_kv_held_tokens")));
        columns.extend((0..np).map(|i| format!("prefill{i}_queue")));
        columns.extend((0..nd).map(|j| format!("decode{j}_queue")));
        let width = columns.len();
        SeriesRecorder {
            interval,
            horizon,
            columns,
            decoders: nd,
            prefillers: np,
            times: Vec::new(),
            rows: Vec::new(),
            next: 0,
            last: vec![0.0; width],
        }
    }

    /// After the run: completes the series to the horizon.
    pub fn finish(&mut self) {
        let h = self.horizon;
        self.emit(h, true);
    }
}

/// Writes `timeseries.csv` and `timeseries.svg` into `dir`.
pub fn write_series(rec: &SeriesRecorder, dir: &Path) -> Result<()> {
    let mut csv = String::from("t");
    for c in &rec.columns {
        csv.push(',');
        csv.push_str(c);
    }
    csv.push('\n');
    for (t, row) in rec.times.iter().zip(&rec.rows) {
        let _ = write!(csv, "{t}");
        for v in row {
            let _ = write!(csv, ",{v}");
        }
        csv.push('\n');
    }
    let svg_path = dir.join("timeseries.svg");
    write_atomic(&svg_path, &series_svg(rec)?)?;
    // The CSV last: it marks the figure done (a resumed sweep checks it).
    write_atomic(&dir.join("timeseries.csv"), &csv)
}

pub fn series_svg(rec: &SeriesRecorder) -> Result<String> {
    let (nd, np) = (rec.decoders, rec.prefillers);
    let panels: [(&str, &str, Vec<usize>); 3] = [
        (
            "decoder KV usage (held / capacity)",
            "fraction",
            (0..nd).collect(),
        ),
        (
            "prefiller KV held (leases included)",
            "tokens",
            (nd..nd + np).collect(),
        ),
        (
            "queues (prefill: waiting; decode: waiting + KV arrived)",
            "requests",
            (nd + np..nd + 2 * np + nd).collect(),
        ),
    ];
    let mut svg = String::new();
    {
        let err = draw_err("the time series");
        let root = SVGBackend::with_string(&mut svg, (1000, 960)).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let areas = root.split_evenly((3, 1));
        let t_max = rec.horizon.max(rec.interval);
        for (area, (title, unit, cols)) in areas.iter().zip(panels) {
            let y_max = cols
                .iter()
                .flat_map(|&c| rec.rows.iter().map(move |r| r[c]))
                .fold(0f64, f64::max);
            let y_max = if y_max > 0.0 { y_max * 1.05 } else { 1.0 };
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 18))
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(60)
                .build_cartesian_2d(0f64..t_max, 0f64..y_max)
                .map_err(&err)?;
            chart
                .configure_mesh()
                .x_desc("simulated seconds")
                .y_desc(unit)
                .draw()
                .map_err(&err)?;
            for (i, &c) in cols.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                let pts = rec.times.iter().zip(&rec.rows).map(|(&t, r)| (t, r[c]));
                chart
                    .draw_series(LineSeries::new(pts, color.stroke_width(1)))
                    .map_err(&err)?
                    .label(rec.columns[c].as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(&err)?;
        }
        root.present().map_err(&err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_bin_by_decade_and_add() {
        let mut values = Histogram::new();
        for v in [1.0, 1.01, 10.0, 0.0] {
            values.record(v);
        }
        let h = LogHistogram::of(&values);
        assert_eq!(h.count, 4);
        assert_eq!(h.nonpositive, 1);
        assert_eq!(h.bins[&0], 2);
        assert_eq!(h.bins[&100], 1);
        let mut g = h.clone();
        g.add(&h);
        assert_eq!(g.count, 8);
        assert_eq!(g.bins[&0], 4);
        let cdf = h.cdf();
        assert_eq!(cdf.first().unwrap().1, 0.25);
        assert_eq!(cdf.last().unwrap().1, 1.0);
        assert!(cdf.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
    }
}
