//! NICs: rates in KV tokens per second, and how one read spreads over the
//! ranks of a prefiller and a decoder with different tensor parallelism.
//!
//! Each rank caches its share of the KV heads (docs/model.md §8 runs over these
//! links): decoder rank `j` of `d` needs the heads in `[j/d, (j+1)/d)`,
//! prefiller rank `i` of `p` holds `[i/p, (i+1)/p)`, so every overlapping
//! pair of ranks moves its overlap, between the NICs the two ranks use.
//! With `p = 1, d = 4` the prefiller's NIC carries four quarter-flows, one
//! to each decoder NIC. Every pair is its own flow (an RDMA connection) in
//! the max-min sharing.

/// Bytes per second of a NIC of `gbps` gigabits per second.
pub fn gbps_to_bytes_per_s(gbps: f64) -> f64 {
    gbps * 1e9 / 8.0
}

/// The NIC (0-based, within its pod) that `rank` of `tp` ranks sends and
/// receives through, when the pod has `nics` NICs: ranks share NICs evenly.
pub fn nic_of(rank: u32, tp: u32, nics: u32) -> u32 {
    (u64::from(rank) * u64::from(nics) / u64::from(tp)) as u32
}

/// One rank-to-rank part of a read: the NICs (within each pod) it crosses
/// and the share of the read's KV it moves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Part {
    pub source_nic: u32,
    pub dest_nic: u32,
    pub share: f64,
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The parts of a read from a prefiller (`p` ranks, `p_nics` NICs) into a
/// decoder (`d` ranks, `d_nics` NICs), in rank order; their shares sum to
/// 1 (exactly 1.0 when `p = d = 1`).
pub fn read_parts(p: u32, p_nics: u32, d: u32, d_nics: u32, out: &mut Vec<Part>) {
    out.clear();
    // Heads in units of 1/lcm(p, d): prefiller rank i holds [i·L/p, (i+1)·L/p).
    let l = p / gcd(p, d) * d;
    let (ps, ds) = (l / p, l / d);
    for i in 0..p {
        for j in 0..d {
            let lo = (i * ps).max(j * ds);
            let hi = ((i + 1) * ps).min((j + 1) * ds);
            if hi > lo {
                out.push(Part {
                    source_nic: nic_of(i, p, p_nics),
                    dest_nic: nic_of(j, d, d_nics),
                    share: f64::from(hi - lo) / f64::from(l),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rank_each_side_is_one_whole_flow() {
        let mut parts = Vec::new();
        read_parts(1, 1, 1, 1, &mut parts);
        assert_eq!(
            parts,
            vec![Part {
                source_nic: 0,
                dest_nic: 0,
                share: 1.0
            }]
        );
    }

    #[test]
    fn tp1_to_tp4_fans_out_in_quarters() {
        let mut parts = Vec::new();
        read_parts(1, 1, 4, 4, &mut parts);
        let dests: Vec<u32> = parts.iter().map(|p| p.dest_nic).collect();
        assert_eq!(dests, [0, 1, 2, 3]);
        assert!(parts.iter().all(|p| p.source_nic == 0 && p.share == 0.25));
        // TP 2 → TP 3 (L = 6): rank 0 holds [0,3), rank 1 [3,6); the
        // decoder's [0,2), [2,4), [4,6) → 2/6, 1/6, 1/6, 2/6.
        read_parts(2, 2, 3, 3, &mut parts);
        let got: Vec<(u32, u32, f64)> = parts
            .iter()
            .map(|p| (p.source_nic, p.dest_nic, p.share * 6.0))
            .collect();
        assert_eq!(got, [(0, 0, 2.0), (0, 1, 1.0), (1, 1, 1.0), (1, 2, 2.0)]);
        // Four decoder ranks on two NICs: ranks 0,1 → NIC 0; 2,3 → NIC 1.
        read_parts(1, 1, 4, 2, &mut parts);
        let dests: Vec<u32> = parts.iter().map(|p| p.dest_nic).collect();
        assert_eq!(dests, [0, 0, 1, 1]);
    }

    #[test]
    fn gigabits_to_bytes() {
        // 400 Gb/s = 400e9 / 8 = 50e9 B/s.
        assert_eq!(gbps_to_bytes_per_s(400.0), 50e9);
    }
}
