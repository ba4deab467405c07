//! Figures: the agent's samples, the baseline's samples taken in the same runs, the
//! per-run ratios, and the verdict against the target.

use serde::Serialize;

#[derive(Debug, Clone, Copy, Serialize)]
pub enum Target {
    /// The median of the per-run ratios agent/baseline must not exceed this.
    RatioAtMost(f64),
    /// The median must not exceed this (in the figure's unit).
    AtMost(f64),
    /// The median must stay below this.
    Below(f64),
    /// Reported for context; no target.
    None,
}

#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub name: String,
    pub unit: &'static str,
    pub agent: Vec<f64>,
    /// Paired with `agent` run by run when present.
    pub baseline: Vec<f64>,
    pub baseline_label: String,
    pub target: Target,
    pub note: String,
}

impl Figure {
    pub fn new(name: impl Into<String>, unit: &'static str, target: Target) -> Figure {
        Figure {
            name: name.into(),
            unit,
            agent: Vec::new(),
            baseline: Vec::new(),
            baseline_label: String::new(),
            target,
            note: String::new(),
        }
    }

    pub fn with_baseline(mut self, label: impl Into<String>) -> Figure {
        self.baseline_label = label.into();
        self
    }

    pub fn ratios(&self) -> Vec<f64> {
        self.agent
            .iter()
            .zip(&self.baseline)
            .filter(|(_, b)| **b > 0.0)
            .map(|(a, b)| a / b)
            .collect()
    }

    /// `Some(true)` when the target is met, `None` when there is none (or no data).
    pub fn met(&self) -> Option<bool> {
        match self.target {
            Target::RatioAtMost(t) => median(&self.ratios()).map(|r| r <= t),
            Target::AtMost(t) => median(&self.agent).map(|m| m <= t),
            Target::Below(t) => median(&self.agent).map(|m| m < t),
            Target::None => None,
        }
    }

    pub fn target_text(&self) -> String {
        match self.target {
            Target::RatioAtMost(t) => format!("≤ {t}×"),
            Target::AtMost(t) => format!("≤ {} {}", fmt_num(t), self.unit),
            Target::Below(t) => format!("< {} {}", fmt_num(t), self.unit),
            Target::None => "—".into(),
        }
    }

    pub fn row(&self) -> String {
        let agent = spread(&self.agent, self.unit);
        let baseline = if self.baseline.is_empty() {
            "—".to_string()
        } else {
            format!(
                "{}: {}",
                self.baseline_label,
                spread(&self.baseline, self.unit)
            )
        };
        let ratios = self.ratios();
        let ratio = match (median(&ratios), min_max(&ratios)) {
            (Some(m), Some((lo, hi))) if ratios.len() > 1 => {
                format!("{m:.2}× ({lo:.2}–{hi:.2})")
            }
            (Some(m), _) => format!("{m:.2}×"),
            _ => "—".into(),
        };
        let met = match self.met() {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "—",
        };
        let n = self.agent.len();
        format!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            self.name,
            agent,
            baseline,
            ratio,
            self.target_text(),
            met,
            if self.note.is_empty() {
                format!("n={n}")
            } else {
                format!("n={n}; {}", self.note)
            }
        )
    }
}

pub const TABLE_HEADER: &str = "| figure | agent: median (min–max) | baseline: median (min–max) | ratio: median (min–max) | target | met? | notes |\n|---|---|---|---|---|---|---|";

pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

pub fn min_max(xs: &[f64]) -> Option<(f64, f64)> {
    let lo = xs.iter().copied().reduce(f64::min)?;
    let hi = xs.iter().copied().reduce(f64::max)?;
    Some((lo, hi))
}

pub fn fmt_num(x: f64) -> String {
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

pub fn spread(xs: &[f64], unit: &str) -> String {
    match (median(xs), min_max(xs)) {
        (Some(m), Some((lo, hi))) if xs.len() > 1 => {
            format!("{} {unit} ({}–{})", fmt_num(m), fmt_num(lo), fmt_num(hi))
        }
        (Some(m), _) => format!("{} {unit}", fmt_num(m)),
        _ => "—".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_ratio() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        let mut f = Figure::new("x", "s", Target::RatioAtMost(1.2));
        f.agent = vec![2.0, 3.0];
        f.baseline = vec![2.0, 2.0];
        assert_eq!(f.ratios(), vec![1.0, 1.5]);
        assert_eq!(f.met(), Some(false));
    }
}
