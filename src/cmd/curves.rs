//! The end-of-run picture of an RL run, drawn in the terminal: the training reward per step
//! and the held-out accuracy (after SFT, every `rl.eval_every` steps, after RL) against the
//! RL step, read back from the run's `metrics.jsonl` and `summary.json` values.

use oxalign_actors::controller::RunSummary;

/// Plot area in characters.
const WIDTH: usize = 60;
const HEIGHT: usize = 21;

/// One curve: its legend, its mark and its `(step, value)` points.
struct Curve {
    label: &'static str,
    mark: char,
    points: Vec<(f64, f64)>,
}

/// The picture of the run in `summary`, or `None` when there is nothing to draw (no
/// `metrics.jsonl`, or fewer than two steps).
pub(crate) fn picture(summary: &RunSummary) -> Option<String> {
    let text = std::fs::read_to_string(summary.run_dir.join("metrics.jsonl")).ok()?;
    let rows: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let steps = rows
        .iter()
        .filter_map(|r| r["step"].as_f64())
        .fold(0.0, f64::max);
    if steps < 2.0 {
        return None;
    }
    let series = |key: &str| -> Vec<(f64, f64)> {
        rows.iter()
            .filter_map(|r| Some((r["step"].as_f64()?, r[key].as_f64()?)))
            .filter(|(_, y)| y.is_finite())
            .collect()
    };
    let with_ends = |mut pts: Vec<(f64, f64)>, start: Option<f64>, end: Option<f64>| {
        if let Some(y) = start {
            pts.insert(0, (0.0, y));
        }
        if let (Some(y), false) = (end, pts.iter().any(|p| p.0 == steps)) {
            pts.push((steps, y));
        }
        pts
    };
    let curves = [
        Curve {
            label: "training reward (mean per step)",
            mark: '.',
            points: series("reward_mean"),
        },
        Curve {
            label: "held-out sampled accuracy",
            mark: 's',
            points: with_ends(
                series("heldout_sampled"),
                summary.sampled_accuracy_sft,
                summary.sampled_accuracy_final,
            ),
        },
        Curve {
            label: "held-out greedy accuracy",
            mark: 'G',
            points: with_ends(
                series("heldout_greedy"),
                summary.accuracy_sft,
                summary.accuracy_final,
            ),
        },
    ];
    Some(draw(&curves, steps))
}

/// Draws `curves` over steps `0..=steps`: later curves over earlier ones (the held-out
/// greedy accuracy last), a curve with several points in one column at their mean.
fn draw(curves: &[Curve], steps: f64) -> String {
    let ys = curves.iter().flat_map(|c| c.points.iter().map(|p| p.1));
    let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
        (a.min(y), b.max(y))
    });
    let (lo, hi) = if lo >= 0.0 && hi <= 1.0 {
        (0.0, 1.0)
    } else if hi > lo {
        (lo, hi)
    } else {
        (lo - 1.0, hi + 1.0)
    };
    let mut grid = vec![vec![' '; WIDTH]; HEIGHT];
    for c in curves {
        let mut cols: Vec<(f64, usize)> = vec![(0.0, 0); WIDTH];
        for &(x, y) in &c.points {
            let col = ((x / steps) * (WIDTH - 1) as f64).round() as usize;
            let cell = &mut cols[col.min(WIDTH - 1)];
            *cell = (cell.0 + y, cell.1 + 1);
        }
        for (col, &(sum, n)) in cols.iter().enumerate().filter(|(_, c)| c.1 > 0) {
            let y = sum / n as f64;
            let row = ((hi - y) / (hi - lo) * (HEIGHT - 1) as f64).round() as usize;
            grid[row.min(HEIGHT - 1)][col] = c.mark;
        }
    }
    let percent = lo == 0.0 && hi == 1.0;
    let label = |row: usize| {
        let y = hi - (hi - lo) * row as f64 / (HEIGHT - 1) as f64;
        match (row.is_multiple_of(4) || row == HEIGHT - 1, percent) {
            (false, _) => String::new(),
            (true, true) => format!("{:.0}%", 100.0 * y),
            (true, false) => format!("{y:.2}"),
        }
    };
    let mut out = String::new();
    for (row, cells) in grid.iter().enumerate() {
        let line: String = cells.iter().collect();
        out.push_str(&format!("{:>7} |{}\n", label(row), line.trim_end()));
    }
    out.push_str(&format!("{:>7} +{}\n", "", "-".repeat(WIDTH)));
    let end = format!("{steps:.0}");
    out.push_str(&format!(
        "{:>7}  0{}{end}  RL step\n",
        "",
        " ".repeat(WIDTH.saturating_sub(1 + end.len()))
    ));
    for c in curves.iter().filter(|c| !c.points.is_empty()) {
        out.push_str(&format!("{:>7}  {} {}\n", "", c.mark, c.label));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{draw, Curve};

    #[test]
    fn marks_land_where_their_values_are() {
        let curves = [
            Curve {
                label: "rising",
                mark: '.',
                points: (1..=100).map(|s| (s as f64, s as f64 / 100.0)).collect(),
            },
            Curve {
                label: "held-out",
                mark: 'G',
                points: vec![(0.0, 0.0), (100.0, 1.0)],
            },
        ];
        let text = draw(&curves, 100.0);
        let lines: Vec<&str> = text.lines().collect();
        // Top row holds 100% and the held-out end point in the last column.
        assert!(lines[0].starts_with("   100% |"), "{text}");
        assert!(lines[0].ends_with('G'), "{text}");
        // Bottom row: 0% and the held-out start point in the first column.
        assert!(lines[20].starts_with("     0% |G."), "{text}");
        assert!(text.contains("G held-out") && text.contains(". rising"));
        assert!(lines[21].ends_with(&"-".repeat(60)));
    }

    #[test]
    fn values_outside_the_unit_range_get_their_own_axis() {
        let curves = [Curve {
            label: "reward",
            mark: '.',
            points: vec![(1.0, -2.0), (2.0, 3.0)],
        }];
        let text = draw(&curves, 2.0);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("   3.00 |") && lines[0].ends_with('.'),
            "{text}"
        );
        assert!(
            lines[20].starts_with("  -2.00 |") && lines[20].ends_with('.'),
            "{text}"
        );
    }
}
