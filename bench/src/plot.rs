//! The picture of one replacement: the leader's and the learner's raft log index over time,
//! with the moments of remove, add, etcd start, catch-up, promotion and ready marked.
//! Text needs a TrueType font (DejaVu Sans from the system, or `BENCH_FONT`); without one
//! the picture is drawn without text.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::replacement::Trace;

const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Registers a font for plotters once; false when none is found.
fn font() -> bool {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DONE.get_or_init(|| {
        let mut paths: Vec<String> = std::env::var("BENCH_FONT").into_iter().collect();
        paths.extend(FONT_CANDIDATES.iter().map(|s| s.to_string()));
        for p in paths {
            if let Ok(bytes) = std::fs::read(&p) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// A line of the picture: label, points, colour, width.
type Line<'a> = (&'a str, Vec<(f64, f64)>, RGBColor, u32);

pub fn replacement(trace: &Trace, path: &Path) -> Result<()> {
    let has_font = font();
    let ev = &trace.events;
    let end = ev.ready.unwrap_or(ev.done).max(ev.done) * 1.05 + 0.1;
    let top = trace
        .samples
        .iter()
        .flat_map(|s| [s.leader_match, s.learner_match, s.learner_applied])
        .flatten()
        .max()
        .unwrap_or(1) as f64
        * 1.08
        + 1.0;
    let root = BitMapBackend::new(path, (1200, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20);
    if has_font {
        builder
            .caption(
                format!(
                    "One replacement with etcd-steward ({} of keys): raft log index over time",
                    trace.size
                ),
                ("sans-serif", 24),
            )
            .x_label_area_size(45)
            .y_label_area_size(80);
    }
    let mut chart = builder
        .build_cartesian_2d(0f64..end, 0f64..top)
        .map_err(|e| anyhow!("{e}"))?;
    let mut mesh = chart.configure_mesh();
    if has_font {
        mesh.x_desc("seconds since the wiped pod started")
            .y_desc("raft log index")
            .label_style(("sans-serif", 15));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(|e| anyhow!("{e}"))?;

    let series = |f: &dyn Fn(&crate::replacement::Sample) -> Option<u64>| -> Vec<(f64, f64)> {
        trace
            .samples
            .iter()
            .filter_map(|s| f(s).map(|i| (s.t, i as f64)))
            .collect()
    };
    let lines: Vec<Line> = vec![
        (
            "leader: its last log index",
            series(&|s| s.leader_match),
            BLUE,
            4,
        ),
        (
            "new member: log received (its match, as the leader sees it)",
            series(&|s| s.learner_match),
            RED,
            3,
        ),
        (
            "new member: applied index (once its client API answers)",
            series(&|s| s.learner_applied),
            RGBColor(255, 160, 0),
            3,
        ),
    ];
    for (label, points, color, width) in lines {
        let s = chart
            .draw_series(LineSeries::new(points, color.stroke_width(width)))
            .map_err(|e| anyhow!("{e}"))?;
        if has_font {
            s.label(label).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(width))
            });
        }
    }

    let grey = RGBColor(120, 120, 120);
    let purple = RGBColor(140, 60, 170);
    let green = RGBColor(20, 150, 60);
    let orange = RGBColor(240, 140, 0);
    let dark_red = RGBColor(170, 0, 0);
    let marks: Vec<(&str, Option<f64>, RGBColor)> = vec![
        ("stale member removed", ev.removed, grey),
        ("learner added (MemberAdd)", ev.added, purple),
        ("etcd exec'd by init", ev.started, green),
        (
            "etcd would accept promotion (match ≥ 90%)",
            ev.caught_up,
            orange,
        ),
        (
            "new member's client API answers",
            ev.serving,
            RGBColor(200, 200, 0),
        ),
        ("promoted by the sidecar", ev.promoted, dark_red),
        ("linearizable read on the new voter", Some(ev.done), BLACK),
        ("/ready 200", ev.ready, RGBColor(0, 170, 200)),
    ];
    for (label, at, color) in marks {
        let Some(x) = at else { continue };
        let s = chart
            .draw_series(LineSeries::new(
                vec![(x, 0.0), (x, top)],
                color.stroke_width(2),
            ))
            .map_err(|e| anyhow!("{e}"))?;
        if has_font {
            s.label(format!("{label}: {x:.2} s")).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2))
            });
        }
    }
    if has_font {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
