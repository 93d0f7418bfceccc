//! Synthetic sessions (MODEL.md §3): each session draws its turns from its
//! own random stream, derived from the run seed and its id.

use bevy_ecs::prelude::*;
use rand::SeedableRng;
use rand_distr::{Bernoulli, Distribution, Exp, Uniform};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::scenario::Workload;

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

fn whole(x: f64) -> u32 {
    x.round().max(1.0) as u32
}

impl Session {
    pub fn new(id: u64, run_seed: u64) -> Session {
        Session {
            id,
            rng: Xoshiro256PlusPlus::seed_from_u64(mix(run_seed, id)),
            context: 0,
            turns: 0,
        }
    }

    pub fn draw_turn(&mut self, w: &Workload) -> Turn {
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

    fn w() -> Workload {
        Workload {
            session_rate: 0.6,
            first_turn_tokens: (1000.0, 3000.0),
            later_turn_tokens_mean: 500.0,
            output_tokens_mean: 200.0,
            continue_probability: 0.9,
            tool_time_mean: 3.0,
        }
    }

    #[test]
    fn a_session_stream_depends_only_on_seed_and_id() {
        let mut a = Session::new(5, 1);
        let mut b = Session::new(5, 1);
        let mut c = Session::new(6, 1);
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
            let mut s = Session::new(id, 3);
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
}
