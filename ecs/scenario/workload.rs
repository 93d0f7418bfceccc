//! The workload section resolved: synthetic session parameters with the
//! reference defaults (docs/model.md §3) applied, and the checks of the section.

use crate::scenario::validate::MAX_HORIZON;
use crate::scenario::{SystemPrompts, Workload};

/// The synthetic sessions' parameters (docs/model.md §3), every default applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Sessions {
    /// Λ: sessions per second (Poisson).
    pub session_rate: f64,
    /// First turn's new prompt tokens: uniform over [min, max].
    pub first_turn_tokens: (f64, f64),
    /// Later turns' new prompt tokens: exponential with this mean.
    pub later_turn_tokens_mean: f64,
    /// Output tokens: exponential with this mean, plus one.
    pub output_tokens_mean: f64,
    /// p: probability that a session continues after a turn.
    pub continue_probability: f64,
    /// Z: mean tool-call time between turns, seconds (exponential).
    pub tool_time_mean: f64,
    pub system_prompts: Option<SystemPrompts>,
}

impl Sessions {
    /// The section's values, defaults where it gives none.
    pub fn of(w: &Workload) -> Sessions {
        Sessions {
            session_rate: w.session_rate.unwrap_or(0.6),
            first_turn_tokens: w.first_turn_tokens.unwrap_or((1000.0, 3000.0)),
            later_turn_tokens_mean: w.later_turn_tokens_mean.unwrap_or(500.0),
            output_tokens_mean: w.output_tokens_mean.unwrap_or(200.0),
            continue_probability: w.continue_probability.unwrap_or(0.9),
            tool_time_mean: w.tool_time_mean.unwrap_or(3.0),
            system_prompts: w.system_prompts.clone(),
        }
    }
}

/// Whether the section sets any synthetic-session parameter.
fn sets_sessions(w: &Workload) -> Option<&'static str> {
    [
        ("session_rate", w.session_rate.is_some()),
        ("first_turn_tokens", w.first_turn_tokens.is_some()),
        ("later_turn_tokens_mean", w.later_turn_tokens_mean.is_some()),
        ("output_tokens_mean", w.output_tokens_mean.is_some()),
        ("continue_probability", w.continue_probability.is_some()),
        ("tool_time_mean", w.tool_time_mean.is_some()),
        ("system_prompts", w.system_prompts.is_some()),
    ]
    .into_iter()
    .find(|(_, set)| *set)
    .map(|(name, _)| name)
}

/// What is wrong with the workload section, one sentence each.
pub fn problems(w: &Workload) -> Vec<String> {
    let mut out = Vec::new();
    let mut need = |ok: bool, msg: String| {
        if !ok {
            out.push(msg);
        }
    };
    let finite_pos = |x: f64| x.is_finite() && x > 0.0;
    if let Some(t) = &w.trace {
        if let Some(name) = sets_sessions(w) {
            need(
                false,
                format!(
                    "workload.{name} is a synthetic-session parameter, which a trace workload does not use: \
                     remove it or workload.trace"
                ),
            );
        }
        need(
            t.block_tokens > 0,
            "workload.trace.block_tokens must be at least 1".into(),
        );
        need(
            finite_pos(t.speedup),
            format!(
                "workload.trace.speedup must be a positive number, got {}",
                t.speedup
            ),
        );
        need(
            finite_pos(t.rate_scale),
            format!(
                "workload.trace.rate_scale must be a positive number, got {}",
                t.rate_scale
            ),
        );
        if let Some((a, b)) = t.window {
            need(
                a.is_finite() && a >= 0.0 && a < b,
                format!(
                    "workload.trace.window must be (start, end) seconds with 0 <= start < end, got ({a}, {b})"
                ),
            );
        }
        need(
            t.max_requests != Some(0),
            "workload.trace.max_requests must be at least 1".into(),
        );
        return out;
    }
    let s = Sessions::of(w);
    need(
        finite_pos(s.session_rate),
        format!(
            "workload.session_rate must be positive, got {}",
            s.session_rate
        ),
    );
    // A gap drawn from a rate below 1 / MAX_HORIZON (or a tool time from a
    // mean above MAX_HORIZON) can pass f64's range: an arrival at infinity.
    need(
        !(finite_pos(s.session_rate) && s.session_rate < 1.0 / MAX_HORIZON),
        format!(
            "workload.session_rate must be at least {:e} per s (one session in the longest \
             horizon, {MAX_HORIZON:e} s), got {:?}",
            1.0 / MAX_HORIZON,
            s.session_rate
        ),
    );
    let (lo, hi) = s.first_turn_tokens;
    need(
        lo.is_finite() && hi.is_finite() && lo >= 0.0 && lo <= hi,
        format!(
            "workload.first_turn_tokens must be (min, max) with 0 <= min <= max, got ({lo}, {hi})"
        ),
    );
    need(
        finite_pos(s.later_turn_tokens_mean),
        format!(
            "workload.later_turn_tokens_mean must be positive, got {}",
            s.later_turn_tokens_mean
        ),
    );
    need(
        finite_pos(s.output_tokens_mean),
        format!(
            "workload.output_tokens_mean must be positive, got {}",
            s.output_tokens_mean
        ),
    );
    need(
        (0.0..=1.0).contains(&s.continue_probability),
        format!(
            "workload.continue_probability must be within [0, 1], got {}",
            s.continue_probability
        ),
    );
    need(
        finite_pos(s.tool_time_mean),
        format!(
            "workload.tool_time_mean must be positive, got {}",
            s.tool_time_mean
        ),
    );
    need(
        !(finite_pos(s.tool_time_mean) && s.tool_time_mean > MAX_HORIZON),
        format!(
            "workload.tool_time_mean must be at most the longest horizon, {MAX_HORIZON:e} s, got {:?}",
            s.tool_time_mean
        ),
    );
    if let Some(p) = &s.system_prompts {
        need(
            p.count > 0,
            "workload.system_prompts.count must be at least 1".into(),
        );
        need(
            p.zipf.is_finite() && p.zipf >= 0.0,
            format!(
                "workload.system_prompts.zipf must be a number >= 0, got {}",
                p.zipf
            ),
        );
    }
    out
}
