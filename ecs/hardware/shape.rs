//! What a step computes, as the physical step-time models need it: the
//! requests in the batch, their tokens, and the context they attend to.

/// One step's composition. For a request with `c` tokens already computed
/// and `n` scheduled: its KV tokens are `c + n`; its tokens attend to
/// `c + 1, c + 2, …, c + n` earlier tokens (full attention), or at most
/// `window` of them (sliding window).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepShape {
    pub requests: u32,
    pub tokens: u64,
    /// Tokens of prompts (prefill chunks), and requests decoding one token.
    pub prompt_tokens: u64,
    pub decode_requests: u32,
    /// Σ (c + n): the KV read by full-attention layers.
    pub kv_tokens: u64,
    /// Σ over the step's tokens of the context each attends to.
    pub attended: f64,
    /// The same two for sliding-window layers: Σ min(c + n, n + w − 1)
    /// cached tokens read, Σ min(context, w) attended.
    pub window_kv: f64,
    pub window_attended: f64,
}

impl StepShape {
    /// Adds a request with `computed` tokens done, `n` scheduled, of which
    /// `prompt` are prompt tokens; `window` is the model's sliding window.
    pub fn add(&mut self, computed: u32, n: u32, prompt: u32, window: Option<u32>) {
        let (c, n64) = (f64::from(computed), f64::from(n));
        self.requests += 1;
        self.tokens += u64::from(n);
        self.prompt_tokens += u64::from(prompt);
        if prompt == 0 {
            self.decode_requests += 1;
        }
        self.kv_tokens += u64::from(computed) + u64::from(n);
        // Σ_{i=1..n} (c + i) = n·c + n(n+1)/2
        self.attended += n64 * c + n64 * (n64 + 1.0) / 2.0;
        if let Some(w) = window {
            let w = f64::from(w);
            self.window_kv += (c + n64).min(n64 + w - 1.0);
            // The first m tokens see c + i ≤ w; the rest see w each.
            let m = (w - c).clamp(0.0, n64);
            self.window_attended += m * c + m * (m + 1.0) / 2.0 + (n64 - m) * w;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_over_a_chunk_by_hand() {
        let mut s = StepShape::default();
        // A chunk of 4 prompt tokens after 2 computed, window 4: contexts
        // 3, 4, 5, 6 → Σ = 18; windowed 3, 4, 4, 4 → 15; KV read 6,
        // windowed min(6, 4 + 4 − 1 = 7) = 6.
        s.add(2, 4, 4, Some(4));
        assert_eq!((s.tokens, s.kv_tokens, s.attended), (4, 6, 18.0));
        assert_eq!((s.window_attended, s.window_kv), (15.0, 6.0));
        // A decode token at context 10, window 4: attends 11 → windowed 4;
        // reads min(11, 1 + 4 − 1 = 4) = 4.
        s.add(10, 1, 0, Some(4));
        assert_eq!((s.requests, s.decode_requests, s.prompt_tokens), (2, 1, 4));
        assert_eq!(
            (s.attended, s.window_attended, s.window_kv),
            (29.0, 19.0, 10.0)
        );
    }
}
