//! A run with its output files: the recorders the files need are set up
//! before the run (engines' exported metrics, the timeline, the AIPerf
//! records, the time series), and every file is written after it (each
//! atomically). `pdsim run` and every run of a sweep go through here.

use std::path::PathBuf;

use crate::engine::Engine;
use crate::error::{Error, Result, num};
use crate::metrics::figures::{
    RunDistributions, cdf_svg, cdf_svg_text, series_svg, series_system, write_series,
};
use crate::metrics::formats::aiperf::AiperfLog;
use crate::metrics::formats::timeline::{Timeline, timeline_system};
use crate::metrics::formats::{bench_json, html, prometheus};
use crate::metrics::{Report, write_atomic};
use crate::scenario::Scenario;
use crate::sim::{Sim, SimSystems};
use bevy_ecs::prelude::*;

/// The files one run writes besides what it prints.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    /// The report, as JSON (`--json`).
    pub json: Option<PathBuf>,
    /// `vllm bench serve --save-result`'s keys, with these percentiles.
    pub bench_json: Option<PathBuf>,
    pub percentiles: Vec<f64>,
    /// AIPerf's two files, in this folder.
    pub aiperf: Option<PathBuf>,
    /// The Prometheus exposition at the end of the run.
    pub prometheus: Option<PathBuf>,
    /// Chrome trace-event JSON, of what overlaps the window.
    pub timeline: Option<PathBuf>,
    pub timeline_window: (f64, f64),
    /// One self-contained HTML page.
    pub html: Option<PathBuf>,
    /// SVG figures (time series and CDFs) in this folder, sampled every
    /// `sample_interval` simulated seconds.
    pub plots: Option<PathBuf>,
    pub sample_interval: f64,
}

/// Samples of a time series a run keeps for its figures.
const MAX_SAMPLES: f64 = 1e6;

impl Outputs {
    /// Runs `scenario` and writes every file asked for.
    pub fn run(&self, scenario: &Scenario) -> Result<Report> {
        if self.plots.is_some() && !(self.sample_interval.is_finite() && self.sample_interval > 0.0)
        {
            return Err(Error::new(format!(
                "--sample-interval must be a positive number of seconds, got {}",
                self.sample_interval
            )));
        }
        let horizon = scenario.raw.horizon;
        if self.plots.is_some()
            && horizon.is_finite()
            && horizon / self.sample_interval > MAX_SAMPLES
        {
            return Err(Error::new(format!(
                "--sample-interval {} s over a {} s horizon is {:.3e} samples per series; at most \
                 {MAX_SAMPLES:e} are kept (a figure is a few thousand pixels wide): give at least {} s",
                num(self.sample_interval),
                num(horizon),
                horizon / self.sample_interval,
                num(horizon / MAX_SAMPLES)
            )));
        }
        let mut sim = Sim::new(scenario)?;
        self.prepare(&mut sim)?;
        let report = sim.run()?;
        self.write(&mut sim, &report)?;
        Ok(report)
    }

    /// Sets up what the files need, before the run.
    pub fn prepare(&self, sim: &mut Sim) -> Result<()> {
        let horizon = sim.horizon();
        let interval = match (&self.plots, &self.html) {
            (Some(_), _) => Some(self.sample_interval),
            // The page's time series: about 2 000 samples, whatever the horizon.
            (None, Some(_)) => Some((horizon / 2000.0).max(1.0)),
            _ => None,
        };
        if let Some(i) = interval {
            sim.record_series(i);
        }
        if self.prometheus.is_some() {
            sim.export_engine_metrics();
        }
        if let Some(dir) = &self.aiperf {
            let warmup = sim.world.resource::<crate::metrics::Metrics>().warmup;
            sim.world.insert_resource(AiperfLog::create(dir, warmup)?);
        }
        if let Some(path) = &self.timeline {
            let t = Timeline::create(path, self.timeline_window, &mut sim.world)?;
            sim.world.insert_resource(t);
            // After the time series too (both read the engines).
            sim.add_systems(
                timeline_system
                    .after(SimSystems::Observe)
                    .after(series_system),
            );
        }
        Ok(())
    }

    /// Writes the files, after the run.
    pub fn write(&self, sim: &mut Sim, report: &Report) -> Result<()> {
        if let Some(path) = &self.json {
            write_atomic(path, &report.to_json())?;
        }
        if let Some(path) = &self.bench_json {
            let p = if self.percentiles.is_empty() {
                vec![99.0]
            } else {
                self.percentiles.clone()
            };
            write_atomic(path, &bench_json::bench_json(report, &p))?;
        }
        if let Some(log) = sim.world.remove_resource::<AiperfLog>() {
            log.finish(report)?;
        }
        if let Some(path) = &self.prometheus {
            write_atomic(
                path,
                &prometheus::exposition(&mut sim.world, &report.scenario),
            )?;
        }
        if let Some(t) = sim.world.remove_resource::<Timeline>() {
            t.finish()?;
        }
        // (A caller that recorded the series for its own use keeps it.)
        let series = if self.plots.is_some() || self.html.is_some() {
            sim.take_series()
        } else {
            None
        };
        let dists = RunDistributions::of(&report.overall);
        let name = format!("{} seed {}", report.scenario, report.seed);
        if let Some(dir) = &self.plots {
            if let Some(s) = &series {
                write_series(s, dir)?;
            }
            for (obs, title, h) in dists.named() {
                cdf_svg(
                    &dir.join(format!("cdf_{obs}.svg")),
                    &format!("{title} CDF"),
                    &[(name.clone(), h.cdf())],
                )?;
            }
        }
        if let Some(path) = &self.html {
            let mut sections = html::run_sections(report);
            sections.push("<h2>Distributions</h2>".into());
            for (_, title, h) in dists.named() {
                sections.push(html::figure(&cdf_svg_text(
                    &format!("{title} CDF"),
                    &[(name.clone(), h.cdf())],
                )?));
            }
            if let Some(s) = &series {
                sections.push("<h2>Time series</h2>".into());
                sections.push(html::figure(&series_svg(s)?));
            }
            write_atomic(path, &html::page(&format!("pdsim: {name}"), &sections))?;
        }
        Ok(())
    }
}

impl Sim {
    /// Every engine keeps what a vLLM engine would export (`--prometheus`).
    pub fn export_engine_metrics(&mut self) {
        for mut e in self.world.query::<&mut Engine>().iter_mut(&mut self.world) {
            e.exported = Some(Default::default());
        }
    }
}
