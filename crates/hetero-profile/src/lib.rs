//! The profiler's outputs: turns a [`hetero_trace::Trace`] into a report
//! (JSON and Markdown, with a section per graph launched), an SVG timeline
//! and a Chrome trace.
//!
//! ```no_run
//! let trace = hetero_trace::take();
//! let paths = hetero_profile::write_all(&trace, std::path::Path::new("profile-out")).unwrap();
//! println!("wrote {}", paths.report_md.display());
//! ```
//!
//! Layers point down only: this crate reads records from `hetero-trace` and
//! knows nothing of devices or streams beyond what the records say.

#![deny(unsafe_op_in_unsafe_fn)]

mod graphs;
mod markdown;
mod report;
mod stats;
mod timeline;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use hetero_trace::Trace;

pub use graphs::{GraphPlanSummary, GraphUsage, LaneUsage, NodeKindUsage};
pub use report::{
    AllocatorReport, AllocatorStats, EngineGaps, EngineUsage, Gap, IotlbUsage, KindLatency,
    LinkSum, MemorySummary, MigrationSum, OpSummary, Report, ReportOptions, StreamUsage, TaskSum,
};
pub use stats::Percentiles;
pub use timeline::{lane_labels, timeline_svg};

/// Where [`write_all`] put each file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    /// Chrome Trace Event JSON (open in ui.perfetto.dev).
    pub trace_json: PathBuf,
    /// The report as Markdown.
    pub report_md: PathBuf,
    /// The report as JSON.
    pub report_json: PathBuf,
    /// The SVG timeline.
    pub timeline_svg: PathBuf,
}

/// Writes trace.json, report.md, report.json and timeline.svg into `dir`
/// (created if missing), with the default [`ReportOptions`].
pub fn write_all(trace: &Trace, dir: &Path) -> io::Result<Paths> {
    write_all_with(trace, dir, &ReportOptions::default())
}

/// [`write_all`] with report options: the link's peak, allocator stats, how
/// many longest ops and idle gaps to list.
pub fn write_all_with(trace: &Trace, dir: &Path, options: &ReportOptions) -> io::Result<Paths> {
    std::fs::create_dir_all(dir)?;
    let paths = Paths {
        trace_json: dir.join("trace.json"),
        report_md: dir.join("report.md"),
        report_json: dir.join("report.json"),
        timeline_svg: dir.join("timeline.svg"),
    };

    let mut out = BufWriter::new(File::create(&paths.trace_json)?);
    hetero_trace::write_chrome_trace(trace, &mut out)?;
    out.flush()?;

    let report = Report::build(trace, options);
    std::fs::write(&paths.report_md, report.to_markdown())?;
    std::fs::write(
        &paths.report_json,
        report.to_json().map_err(io::Error::other)?,
    )?;
    std::fs::write(&paths.timeline_svg, timeline_svg(trace)?)?;
    Ok(paths)
}
