//! The report in Markdown: one section per part of [`Report`], each table
//! with the definitions a reader needs (see `report.rs`).

use std::fmt::Write as _;

use crate::graphs;
use crate::report::Report;
use crate::stats::{fmt_bytes, fmt_ns};
use hetero_trace::{OpKind, TraceClock};

impl Report {
    /// The report as Markdown.
    pub fn to_markdown(&self) -> String {
        let mut md = String::new();
        // `write!` into a String cannot fail; the results are ignored.
        let _ = self.write_markdown(&mut md);
        md
    }

    fn write_markdown(&self, md: &mut String) -> std::fmt::Result {
        // What the times are: a device's virtual clock, or the host's.
        let on_device_clock = self.clock == TraceClock::Virtual.as_str();
        let time = if on_device_clock {
            "device time"
        } else {
            "wall time"
        };
        let device = if self.device_name.is_empty() {
            "(unnamed device)"
        } else {
            &self.device_name
        };
        writeln!(md, "# hetero profile: {device}\n")?;
        let launches = self
            .latency
            .iter()
            .find(|l| l.kind == OpKind::Graph.as_str())
            .map_or(0, |l| l.count);
        let graphs = if launches > 0 {
            format!(
                " {launches} of them graph launches, which ran {} nodes.",
                self.graph_nodes
            )
        } else {
            String::new()
        };
        writeln!(
            md,
            "{} ops ({} failed) over {} of {time}.{graphs}\n",
            self.ops,
            self.failed_ops,
            fmt_ns(self.wall_ns)
        )?;
        if on_device_clock {
            writeln!(
                md,
                "Times are on the device's virtual clock: modelled, not measured on the host.\n"
            )?;
        }
        if self.dropped_records > 0 {
            writeln!(
                md,
                "**{} records were dropped** past the recorder's bound \
                 (`HETERO_PROFILE_MAX_RECORDS`, `hetero_trace::set_max_records`): \
                 this report covers the rest.\n",
                self.dropped_records
            )?;
        }

        writeln!(md, "## Engines\n")?;
        writeln!(
            md,
            "Utilization is busy time (the union of the engine's ops) over the {time}; \
             bandwidth is bytes over busy time (1 GB/s = 10^9 B/s). A graph's nodes count \
             on the engines that ran them, its launch does not.\n"
        )?;
        writeln!(
            md,
            "| engine | ops | busy | utilization | bytes | bandwidth | of link peak |"
        )?;
        writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")?;
        for e in &self.engines {
            writeln!(
                md,
                "| {} | {} | {} | {:.1} % | {} | {} | {} |",
                e.engine,
                e.ops,
                fmt_ns(e.busy_ns),
                e.utilization * 100.0,
                fmt_bytes(e.bytes),
                e.bandwidth_gbps
                    .map_or("-".to_string(), |bw| format!("{bw:.2} GB/s")),
                e.peak_fraction
                    .map_or("-".to_string(), |f| format!("{:.1} %", f * 100.0)),
            )?;
        }
        if let Some(peak) = self.link_peak_gbps {
            writeln!(
                md,
                "\nLink peak: {peak:.2} GB/s; only the H2D and D2H engines are measured \
                 against it (on-device copies and fills do not cross the link)."
            )?;
        }

        writeln!(md, "\n## Streams\n")?;
        writeln!(md, "| stream | ops | busy | bytes |")?;
        writeln!(md, "| --- | ---: | ---: | ---: |")?;
        for s in &self.streams {
            writeln!(
                md,
                "| {} | {} | {} | {} |",
                s.name,
                s.ops,
                fmt_ns(s.busy_ns),
                fmt_bytes(s.bytes)
            )?;
        }

        writeln!(md, "\n## Latency\n")?;
        writeln!(
            md,
            "Queued is submit → start, exec is start → end (hdrhistogram, 3 significant digits).\n"
        )?;
        writeln!(
            md,
            "| kind | count | queued p50 | p90 | p99 | max | exec p50 | p90 | p99 | max |"
        )?;
        writeln!(
            md,
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        )?;
        for l in &self.latency {
            writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                l.kind,
                l.count,
                fmt_ns(l.queued.p50_ns),
                fmt_ns(l.queued.p90_ns),
                fmt_ns(l.queued.p99_ns),
                fmt_ns(l.queued.max_ns),
                fmt_ns(l.exec.p50_ns),
                fmt_ns(l.exec.p90_ns),
                fmt_ns(l.exec.p99_ns),
                fmt_ns(l.exec.max_ns),
            )?;
        }

        graphs::write_markdown(md, &self.graphs, self.launches_without_nodes)?;

        writeln!(md, "\n## Longest operations\n")?;
        writeln!(
            md,
            "| name | kind | stream | engine | start | duration | bytes |"
        )?;
        writeln!(md, "| --- | --- | ---: | --- | ---: | ---: | ---: |")?;
        for o in &self.longest_ops {
            writeln!(
                md,
                "| {}{} | {} | {} | {} | {} | {} | {} |",
                o.name,
                if o.failed { " (failed)" } else { "" },
                o.kind,
                o.stream,
                o.engine,
                fmt_ns(o.start_ns.saturating_sub(self.window_start_ns)),
                fmt_ns(o.duration_ns),
                fmt_bytes(o.bytes)
            )?;
        }

        writeln!(md, "\n## Idle gaps\n")?;
        writeln!(
            md,
            "Where an engine waited between its first and last op (times from the window start).\n"
        )?;
        writeln!(md, "| engine | idle total | largest gaps |")?;
        writeln!(md, "| --- | ---: | --- |")?;
        for g in &self.idle_gaps {
            let list: Vec<String> = g
                .gaps
                .iter()
                .map(|gap| {
                    format!(
                        "{} at {}–{}",
                        fmt_ns(gap.duration_ns),
                        fmt_ns(gap.start_ns.saturating_sub(self.window_start_ns)),
                        fmt_ns(gap.end_ns.saturating_sub(self.window_start_ns))
                    )
                })
                .collect();
            let list = if list.is_empty() {
                "none".to_string()
            } else {
                list.join("; ")
            };
            writeln!(md, "| {} | {} | {} |", g.engine, fmt_ns(g.idle_ns), list)?;
        }

        if let Some(m) = &self.memory {
            writeln!(md, "\n## Memory pool events\n")?;
            writeln!(md, "| allocs | frees | chunk maps | chunk unmaps | allocated in total | peak reserved | peak allocated |")?;
            writeln!(md, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")?;
            writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} |",
                m.allocs,
                m.frees,
                m.chunk_maps,
                m.chunk_unmaps,
                fmt_bytes(m.alloc_bytes),
                fmt_bytes(m.peak_reserved),
                fmt_bytes(m.peak_allocated)
            )?;
        }
        if !self.iotlb.is_empty() {
            writeln!(md, "\n## I/O TLB\n")?;
            writeln!(md, "| engine | hits | misses | hit rate |")?;
            writeln!(md, "| --- | ---: | ---: | ---: |")?;
            for t in &self.iotlb {
                writeln!(
                    md,
                    "| {} | {} | {} | {:.1} % |",
                    t.engine,
                    t.hits,
                    t.misses,
                    t.hit_rate * 100.0
                )?;
            }
        }
        if !self.tasks.is_empty() {
            writeln!(md, "\n## Tasks (per kernel and device)\n")?;
            writeln!(
                md,
                "| kernel | device | tasks | time | predicted | mean prediction error |"
            )?;
            writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: |")?;
            for t in &self.tasks {
                writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {:.1} % |",
                    t.kernel,
                    t.device,
                    t.tasks,
                    fmt_ns(t.measured_ns),
                    t.predicted,
                    t.mean_relative_error * 100.0
                )?;
            }
        }
        if !self.links.is_empty() {
            writeln!(md, "\n## Task data moved (per link)\n")?;
            writeln!(md, "| from device | to device | bytes |")?;
            writeln!(md, "| ---: | ---: | ---: |")?;
            for l in &self.links {
                writeln!(md, "| {} | {} | {} |", l.from, l.to, fmt_bytes(l.bytes))?;
            }
        }
        if !self.migrations.is_empty() {
            writeln!(md, "\n## Migrations (managed memory)\n")?;
            writeln!(md, "| reason | direction | runs | pages | bytes |")?;
            writeln!(md, "| --- | --- | ---: | ---: | ---: |")?;
            let (mut pages, mut bytes) = (0, 0);
            for m in &self.migrations {
                let dir = if m.to_host { "to host" } else { "to device" };
                writeln!(
                    md,
                    "| {} | {dir} | {} | {} | {} |",
                    m.reason,
                    m.runs,
                    m.pages,
                    fmt_bytes(m.bytes)
                )?;
                pages += m.pages;
                bytes += m.bytes;
            }
            writeln!(md, "| total | | | {pages} | {} |", fmt_bytes(bytes))?;
        }
        if let Some(a) = &self.allocator {
            writeln!(md, "\n## Allocator\n")?;
            writeln!(
                md,
                "- cache hit rate: {} ({} hits, {} misses)",
                a.hit_rate
                    .map_or("-".to_string(), |r| format!("{:.1} %", r * 100.0)),
                a.stats.cache_hits,
                a.stats.cache_misses
            )?;
            writeln!(
                md,
                "- fragmentation: {:.1} %",
                a.stats.fragmentation * 100.0
            )?;
            writeln!(
                md,
                "- reserved: {}, allocated: {}",
                fmt_bytes(a.stats.reserved_bytes),
                fmt_bytes(a.stats.allocated_bytes)
            )?;
        }
        Ok(())
    }
}
