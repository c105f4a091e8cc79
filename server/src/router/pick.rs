//! Choosing among matching agents: least loaded first, ties at random, best-of-k sampling.
//!
//! With up to [`SAMPLE`] usable agents, all of them are ranked. With more, [`SAMPLE`] distinct
//! ones are drawn uniformly at random (Floyd's algorithm, no allocation) and only those are
//! ranked, so a pick costs the same with 9 agents as with 10,000. This is the "power of k
//! choices": the chosen agent is the least loaded of a random sample rather than of the whole
//! set, which keeps load within a small margin of even while every agent keeps being chosen.

use rand::seq::SliceRandom;
use rand::Rng;

use super::{AgentKey, MAX_CANDIDATES, SAMPLE};

/// Up to [`MAX_CANDIDATES`] agents from `usable`, best first: least `load` first, ties in
/// random order. `usable` must not be empty for the result to be non-empty.
pub(crate) fn rank<R: Rng + ?Sized>(
    usable: &[AgentKey],
    load: impl Fn(AgentKey) -> usize,
    rng: &mut R,
) -> Vec<AgentKey> {
    let mut picked = [(0_usize, 0 as AgentKey); SAMPLE];
    let n = sample(usable, &mut picked, rng);
    let picked = &mut picked[..n];
    for entry in picked.iter_mut() {
        entry.0 = load(entry.1);
    }
    // A random order, then a stable sort by load: agents with equal load stay in random order.
    picked.shuffle(rng);
    picked.sort_by_key(|&(load, _)| load);
    picked
        .iter()
        .take(MAX_CANDIDATES)
        .map(|&(_, agent)| agent)
        .collect()
}

/// Fills `out` with `min(usable.len(), SAMPLE)` distinct agents of `usable`, each subset
/// equally likely; returns how many.
fn sample<R: Rng + ?Sized>(
    usable: &[AgentKey],
    out: &mut [(usize, AgentKey); SAMPLE],
    rng: &mut R,
) -> usize {
    let len = usable.len();
    if len <= SAMPLE {
        for (slot, &agent) in out.iter_mut().zip(usable) {
            slot.1 = agent;
        }
        return len;
    }
    // Floyd: for j in len-k..len, draw t in 0..=j; take t unless already taken, else take j.
    let mut indices = [0_usize; SAMPLE];
    for (n, j) in (len - SAMPLE..len).enumerate() {
        let t = rng.random_range(0..=j);
        indices[n] = if indices[..n].contains(&t) { j } else { t };
    }
    for (slot, &i) in out.iter_mut().zip(&indices) {
        slot.1 = usable[i];
    }
    SAMPLE
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn sample_is_distinct_and_uniform() {
        let usable: Vec<AgentKey> = (0..20).collect();
        let mut rng = StdRng::seed_from_u64(1);
        let mut counts = [0_u32; 20];
        let mut out = [(0, 0); SAMPLE];
        for _ in 0..20_000 {
            assert_eq!(sample(&usable, &mut out, &mut rng), SAMPLE);
            let mut seen: Vec<AgentKey> = out.iter().map(|e| e.1).collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), SAMPLE);
            for agent in seen {
                counts[agent as usize] += 1;
            }
        }
        // Each agent is in a sample with probability 8/20: 8,000 of 20,000.
        for c in counts {
            assert!((7_400..8_600).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn least_loaded_first() {
        let mut rng = StdRng::seed_from_u64(2);
        let usable = [10, 11, 12, 13];
        let got = rank(&usable, |a| [5, 1, 3, 0][(a - 10) as usize], &mut rng);
        assert_eq!(got, vec![13, 11, 12]);
        assert!(rank(&[], |_| 0, &mut rng).is_empty());
    }
}
