//! Synthetic sessions (docs/model.md §3): each session draws its turns from its
//! own random stream, derived from the run seed and its id.

use bevy_ecs::prelude::*;
use rand::SeedableRng;
use rand_distr::{Bernoulli, Distribution, Exp, Uniform, Zipf};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::engine::{BlockPath, Segment};
use crate::scenario::Sessions;

/// Stream ids of the shared system prompts (prompt `k` is `BASE + k`), far
/// from the sessions' own (their ids).
pub const SYSTEM_PROMPT_STREAMS: u64 = 1 << 41;

/// splitmix64: derives independent stream seeds from (run seed, stream id).
pub fn mix(seed: u64, stream: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A session: its context so far and its own random stream, so that a policy
/// change does not reshuffle the workload (common random numbers).
#[derive(Component, Debug)]
pub struct Session {
    pub id: u64,
    rng: Xoshiro256PlusPlus,
    /// K: tokens of context so far.
    pub context: u32,
    pub turns: u32,
    /// Its tokens' identity: its own stream, after its system prompt's.
    pub path: BlockPath,
}

/// One turn's draws. All four are drawn every turn, in this order, so a
/// session's stream stays aligned whatever happens to its requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Turn {
    pub new_tokens: u32,
    pub output: u32,
    pub continues: bool,
    pub tool_time: f64,
}

/// Keeps the system-prompt draws apart from the sessions' own streams.
const PROMPT_SALT: u64 = 0x5157_E3F0_0D5A_17ED;

fn whole(x: f64) -> u32 {
    x.round().max(1.0) as u32
}

impl Session {
    /// Session `id` of a run with seed `run_seed`. With shared system
    /// prompts its context starts with one, drawn from a stream of its own
    /// (so its turns draw the same numbers with and without them).
    pub fn new(id: u64, run_seed: u64, w: &Sessions) -> Session {
        let (context, path) = match &w.system_prompts {
            None => (0, BlockPath::stream(id)),
            Some(p) => {
                let mut rng = Xoshiro256PlusPlus::seed_from_u64(mix(run_seed ^ PROMPT_SALT, id));
                let k = Zipf::new(p.count as f64, p.zipf)
                    .expect("validated")
                    .sample(&mut rng) as u64;
                let path = BlockPath::new(vec![
                    Segment {
                        stream: SYSTEM_PROMPT_STREAMS + k,
                        start: 0,
                    },
                    Segment {
                        stream: id,
                        start: p.tokens,
                    },
                ]);
                (p.tokens, path)
            }
        };
        Session {
            id,
            rng: Xoshiro256PlusPlus::seed_from_u64(mix(run_seed, id)),
            context,
            turns: 0,
            path,
        }
    }

    pub fn draw_turn(&mut self, w: &Sessions) -> Turn {
        let n = if self.turns == 0 {
            let (lo, hi) = w.first_turn_tokens;
            Uniform::new_inclusive(lo, hi)
                .expect("validated")
                .sample(&mut self.rng)
        } else {
            Exp::new(1.0 / w.later_turn_tokens_mean)
                .expect("validated")
                .sample(&mut self.rng)
        };
        let o = Exp::new(1.0 / w.output_tokens_mean)
            .expect("validated")
            .sample(&mut self.rng)
            + 1.0;
        let continues = Bernoulli::new(w.continue_probability)
            .expect("validated")
            .sample(&mut self.rng);
        let tool_time = Exp::new(1.0 / w.tool_time_mean)
            .expect("validated")
            .sample(&mut self.rng);
        self.turns += 1;
        Turn {
            new_tokens: whole(n),
            output: whole(o),
            continues,
            tool_time,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w() -> Sessions {
        Sessions::of(&Default::default())
    }

    #[test]
    fn a_session_stream_depends_only_on_seed_and_id() {
        let mut a = Session::new(5, 1, &w());
        let mut b = Session::new(5, 1, &w());
        let mut c = Session::new(6, 1, &w());
        let ta = a.draw_turn(&w());
        assert_eq!(ta, b.draw_turn(&w()));
        assert_ne!(ta, c.draw_turn(&w()));
        assert!((1000..=3000).contains(&ta.new_tokens));
        assert!(ta.output >= 1);
    }

    #[test]
    fn draws_have_the_model_means() {
        // 20 000 turns: means within a few standard errors.
        let (mut n_sum, mut o_sum, mut cont, mut tool) = (0.0, 0.0, 0.0, 0.0);
        let k = 20_000;
        for id in 0..k {
            let mut s = Session::new(id, 3, &w());
            s.draw_turn(&w());
            let t = s.draw_turn(&w()); // a later turn
            n_sum += t.new_tokens as f64;
            o_sum += t.output as f64;
            cont += t.continues as u32 as f64;
            tool += t.tool_time;
        }
        let k = k as f64;
        assert!(
            (n_sum / k - 500.0).abs() < 15.0,
            "later-turn mean {}",
            n_sum / k
        );
        assert!((o_sum / k - 201.0).abs() < 6.0, "output mean {}", o_sum / k);
        assert!((cont / k - 0.9).abs() < 0.01, "continue {}", cont / k);
        assert!((tool / k - 3.0).abs() < 0.1, "tool {}", tool / k);
    }

    #[test]
    fn system_prompts_follow_a_zipf_law_and_do_not_move_the_turns() {
        // 4 prompts of 100 tokens, Zipf exponent 1: prompt k with
        // probability (1/k) / (1 + 1/2 + 1/3 + 1/4) = (1/k) / 2.0833.
        let mut shared = w();
        shared.system_prompts = Some(crate::scenario::SystemPrompts {
            count: 4,
            tokens: 100,
            zipf: 1.0,
        });
        let n = 20_000;
        let mut counts = [0u32; 4];
        for id in 0..n {
            let mut s = Session::new(id, 7, &shared);
            assert_eq!(s.context, 100);
            let seg = s.path.segments();
            assert_eq!((seg[1].stream, seg[1].start), (id, 100));
            counts[(seg[0].stream - SYSTEM_PROMPT_STREAMS - 1) as usize] += 1;
            // The turns draw what they draw without a system prompt.
            let mut plain = Session::new(id, 7, &w());
            assert_eq!(s.draw_turn(&shared), plain.draw_turn(&w()));
        }
        for (k, &c) in counts.iter().enumerate() {
            let p = 1.0 / (k as f64 + 1.0) / (1.0 + 0.5 + 1.0 / 3.0 + 0.25);
            let got = c as f64 / n as f64;
            assert!((got - p).abs() < 0.015, "prompt {}: {got} vs {p}", k + 1);
        }
    }
}
