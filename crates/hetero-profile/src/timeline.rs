//! The SVG timeline: one lane per engine used, then one per stream used, ops
//! as bars coloured by kind, a legend of the kinds present, time in ms from
//! the first op's start. Overlap between lanes is what it is for: copy and
//! compute running at once show as bars stacked in time.
//!
//! Graph launches: a launch is a full-height bar and its nodes are drawn over
//! it, lower by a strip, so the launch shows as their parent. On a stream the
//! nodes of plan lane 0 lie on the stream's lane, those of lane k on a lane
//! "stream S graph lane k" right below; on engines each node is on the engine
//! that ran it.

use std::collections::BTreeSet;

use hetero_trace::{EngineKind, OpKind, OpRecord, Trace};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const WIDTH: u32 = 1200;
const LANE_PX: u32 = 26;
const TOP_PX: u32 = 56;
const BOTTOM_PX: u32 = 48;

/// The colour of each kind of op.
pub(crate) fn kind_color(kind: OpKind) -> RGBColor {
    match kind {
        OpKind::H2D => RGBColor(31, 119, 180),
        OpKind::D2H => RGBColor(44, 160, 44),
        OpKind::D2D => RGBColor(23, 190, 207),
        OpKind::Fill => RGBColor(127, 127, 127),
        OpKind::Kernel => RGBColor(255, 127, 14),
        OpKind::HostFn => RGBColor(148, 103, 189),
        // Waits are stalls, not work: a light tint so work stands out.
        OpKind::Wait => RGBColor(242, 182, 182),
        OpKind::Record => RGBColor(0, 0, 0),
        // A container: light, so its nodes stand out over it.
        OpKind::Graph => RGBColor(219, 219, 141),
    }
}

/// What a lane shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Lane {
    Engine(EngineKind, u32),
    /// A stream (graph lane 0 and every op that is no node) or one of its
    /// graph lanes k ≥ 1.
    Stream(u64, u32),
}

/// The graph lane of an op: its node's plan lane, 0 for an op that is no node.
fn graph_lane(op: &OpRecord) -> u32 {
    op.node.map_or(0, |n| n.lane)
}

/// The lane labels of a trace, top to bottom: engines in (kind, index)
/// order, then streams by id, each followed by its graph lanes. These are the
/// texts the SVG shows.
pub fn lane_labels(trace: &Trace) -> Vec<String> {
    lanes(trace)
        .into_iter()
        .map(|lane| label(trace, lane))
        .collect()
}

fn lanes(trace: &Trace) -> Vec<Lane> {
    let mut set = BTreeSet::new();
    for op in &trace.ops {
        set.insert(Lane::Engine(op.engine, op.engine_index));
        set.insert(Lane::Stream(op.stream, graph_lane(op)));
    }
    set.into_iter().collect()
}

fn label(trace: &Trace, lane: Lane) -> String {
    match lane {
        Lane::Engine(kind, index) => format!("{} {}", kind.as_str(), index),
        Lane::Stream(s, 0) => trace.stream_label(s),
        Lane::Stream(s, k) => format!("{} graph lane {k}", trace.stream_label(s)),
    }
}

fn plot_err<E: std::fmt::Display>(e: E) -> std::io::Error {
    std::io::Error::other(format!("drawing the timeline: {e}"))
}

/// Renders the timeline as an SVG document.
pub fn timeline_svg(trace: &Trace) -> std::io::Result<String> {
    let lanes = lanes(trace);
    let labels: Vec<String> = lanes.iter().map(|&l| label(trace, l)).collect();
    let n = lanes.len().max(1);
    let height = TOP_PX + BOTTOM_PX + LANE_PX * n as u32;
    let label_px = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0) as u32 * 7 + 20;

    let start = trace.ops.iter().map(|o| o.start_ns).min().unwrap_or(0);
    let end = trace
        .ops
        .iter()
        .map(|o| o.end_ns.max(o.start_ns))
        .max()
        .unwrap_or(0);
    let span_ms = ((end - start) as f64 / 1e6).max(1e-6);
    let ms = |ns: u64| ns.saturating_sub(start) as f64 / 1e6;
    // Records and very short ops still get a visible sliver.
    let min_width = span_ms / 2000.0;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;

        let title = if trace.device_name.is_empty() {
            "hetero timeline".to_string()
        } else {
            format!("hetero timeline: {}", trace.device_name)
        };
        root.draw(&Text::new(
            title,
            (10, 8),
            ("sans-serif", 16).into_font().color(&BLACK),
        ))
        .map_err(plot_err)?;

        // Legend: the kinds present, in a row under the title.
        let kinds: Vec<OpKind> = OpKind::ALL
            .into_iter()
            .filter(|k| trace.ops.iter().any(|o| o.kind == *k))
            .collect();
        let mut x = 10;
        for kind in kinds {
            root.draw(&Rectangle::new(
                [(x, 34), (x + 12, 46)],
                kind_color(kind).filled(),
            ))
            .map_err(plot_err)?;
            root.draw(&Text::new(
                kind.as_str(),
                (x + 16, 40),
                ("sans-serif", 12)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(plot_err)?;
            x += 24 + 8 * kind.as_str().len() as i32;
        }

        let mut chart = ChartBuilder::on(&root)
            .margin_top(TOP_PX)
            .margin_left(label_px)
            .margin_right(20)
            .x_label_area_size(BOTTOM_PX - 8)
            .y_label_area_size(0)
            .build_cartesian_2d(0.0..span_ms * 1.01, 0.0..n as f64)
            .map_err(plot_err)?;
        // Lane i is drawn top-down: its band is [n-1-i, n-i) on the y axis.
        let band = |i: usize| (n - 1 - i) as f64;
        chart
            .draw_series((0..lanes.len()).filter(|i| i % 2 == 1).map(|i| {
                Rectangle::new(
                    [(0.0, band(i)), (span_ms * 1.01, band(i) + 1.0)],
                    RGBColor(245, 245, 245).filled(),
                )
            }))
            .map_err(plot_err)?;

        // The grid after the shading, so it shows on every lane.
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc("time (ms)")
            .x_label_formatter(&|v| format!("{v:.3}"))
            .draw()
            .map_err(plot_err)?;

        for (i, &lane) in lanes.iter().enumerate() {
            let y = band(i);
            let on_lane = trace.ops.iter().filter(|o| match lane {
                Lane::Engine(kind, index) => o.engine == kind && o.engine_index == index,
                Lane::Stream(s, k) => o.stream == s && graph_lane(o) == k,
            });
            // Launches and other ops first, then nodes over them.
            let (nodes, ops): (Vec<&OpRecord>, Vec<&OpRecord>) =
                on_lane.partition(|o| o.node.is_some());
            let bar = |o: &OpRecord| {
                let x0 = ms(o.start_ns);
                let x1 = ms(o.end_ns.max(o.start_ns)).max(x0 + min_width);
                // y grows upwards: a node's bar leaves the launch's top strip free.
                let top = if o.node.is_some() { 0.65 } else { 0.85 };
                [(x0, y + 0.15), (x1, y + top)]
            };
            let bars = ops.iter().chain(&nodes).map(|o| {
                let style = if o.failed {
                    RED.stroke_width(2)
                } else {
                    kind_color(o.kind).filled()
                };
                Rectangle::new(bar(o), style)
            });
            chart.draw_series(bars).map_err(plot_err)?;
            // Nodes back to back (a chain) stay apart: a white edge on each.
            let edges = nodes
                .iter()
                .filter(|o| !o.failed)
                .map(|o| Rectangle::new(bar(o), WHITE.stroke_width(1)));
            chart.draw_series(edges).map_err(plot_err)?;

            let (_, py) = chart.backend_coord(&(0.0, y + 0.5));
            root.draw(&Text::new(
                labels[i].clone(),
                (8, py),
                ("sans-serif", 12)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(plot_err)?;
        }
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}
