//! The terminal view of a run: a progress bar with ETA and the key metrics, drawn under the
//! per-step table (RL) or the evaluation lines (SFT, RM, DPO). `--quiet` turns both off; when stderr is not a terminal the bar hides
//! itself and the table still goes to stdout.

use indicatif::{ProgressBar, ProgressStyle};

/// Progress over the steps of a run.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar for `total` RL steps, `done` of them already finished (resume); none when
    /// `quiet`.
    pub(crate) fn new(total: u64, done: u64, quiet: bool) -> Self {
        Self::counting(total, done, quiet, "RL")
    }

    /// A bar for `total` steps of a `kind` run (`"RL"`, `"SFT"`, `"RM"`, `"DPO"`), `done`
    /// of them already finished; none when `quiet`.
    pub(crate) fn counting(total: u64, done: u64, quiet: bool, kind: &str) -> Self {
        if quiet {
            return Self { bar: None };
        }
        let bar = ProgressBar::new(total);
        let template =
            format!("{{bar:30.cyan/blue}} {{pos}}/{{len}} {kind} steps  ETA {{eta}}  {{msg}}");
        let style = ProgressStyle::with_template(&template)
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_position(done);
        Self { bar: Some(bar) }
    }

    /// Prints a table line above the bar (or plainly when the bar is hidden).
    pub(crate) fn line(&self, text: &str) {
        match &self.bar {
            Some(b) if !b.is_hidden() => b.println(text),
            Some(_) => println!("{text}"),
            None => {}
        }
    }

    /// Prints a warning line on stderr, above the bar (also with `--quiet`).
    pub(crate) fn warn(&self, text: &str) {
        match &self.bar {
            Some(b) if !b.is_hidden() => b.suspend(|| eprintln!("warning: {text}")),
            _ => eprintln!("warning: {text}"),
        }
    }

    /// One step done; `brief` is shown next to the bar.
    pub(crate) fn step(&self, brief: String) {
        if let Some(b) = &self.bar {
            b.set_message(brief);
            b.inc(1);
        }
    }

    /// Removes the bar (the table stays).
    pub(crate) fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
