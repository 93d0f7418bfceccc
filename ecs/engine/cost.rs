//! The step cost: how long a step of a given composition takes.

use crate::engine::Engine;
use crate::scenario::StepCost;

/// `c0 + max(omega + beta × kv, tokens × a)` seconds (MODEL.md §5): a step of
/// `tokens` scheduled tokens whose requests hold `kv_tokens` of KV.
pub fn linear(c: &StepCost, tokens: u64, kv_tokens: u64) -> f64 {
    c.c0 + (c.omega + c.beta * kv_tokens as f64).max(tokens as f64 * c.a)
}

impl Engine {
    /// The cost of one step of `tokens` tokens over `kv_tokens` of KV.
    pub(crate) fn cost_of(&self, tokens: u64, kv_tokens: u64) -> f64 {
        linear(&self.cost, tokens, kv_tokens)
    }
}
