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
/// random order. An agent whose `load` is an error (no room for another tunnel) ranks after
/// every other and is left out; when that leaves none of the first [`MAX_CANDIDATES`], the
/// worst of their errors is returned. Empty `usable`, empty answer.
pub(crate) fn rank<E: Ord + Copy, R: Rng + ?Sized>(
    usable: &[AgentKey],
    load: impl Fn(AgentKey) -> Result<usize, E>,
    rng: &mut R,
) -> Result<Vec<AgentKey>, E> {
    let mut sampled = [0 as AgentKey; SAMPLE];
    let n = sample(usable, &mut sampled, rng);
    let mut picked = [(0_usize, 0 as AgentKey, None); SAMPLE];
    let picked = &mut picked[..n];
    for (entry, &agent) in picked.iter_mut().zip(&sampled) {
        *entry = match load(agent) {
            Ok(load) => (load, agent, None),
            // Last, so that a sample with room anywhere yields that agent first.
            Err(no_room) => (usize::MAX, agent, Some(no_room)),
        };
    }
    // A random order, then a stable sort by load: agents with equal load stay in random order.
    picked.shuffle(rng);
    picked.sort_by_key(|&(load, _, _)| load);
    let first = &picked[..n.min(MAX_CANDIDATES)];
    if first.iter().all(|&(_, _, no_room)| no_room.is_none()) {
        return Ok(first.iter().map(|&(_, agent, _)| agent).collect());
    }
    let worst = first.iter().filter_map(|&(_, _, no_room)| no_room).max();
    let chosen: Vec<AgentKey> = first
        .iter()
        .filter(|&&(_, _, no_room)| no_room.is_none())
        .map(|&(_, agent, _)| agent)
        .collect();
    match worst {
        Some(no_room) if chosen.is_empty() => Err(no_room),
        _ => Ok(chosen),
    }
}

/// Fills `out` with `min(usable.len(), SAMPLE)` distinct agents of `usable`, each subset
/// equally likely; returns how many.
fn sample<R: Rng + ?Sized>(
    usable: &[AgentKey],
    out: &mut [AgentKey; SAMPLE],
    rng: &mut R,
) -> usize {
    let len = usable.len();
    if len <= SAMPLE {
        out[..len].copy_from_slice(usable);
        return len;
    }
    // Floyd: for j in len-k..len, draw t in 0..=j; take t unless already taken, else take j.
    let mut indices = [0_usize; SAMPLE];
    for (n, j) in (len - SAMPLE..len).enumerate() {
        let t = rng.random_range(0..=j);
        indices[n] = if indices[..n].contains(&t) { j } else { t };
    }
    for (slot, &i) in out.iter_mut().zip(&indices) {
        *slot = usable[i];
    }
    SAMPLE
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn sample_is_distinct_and_uniform() {
        let usable: Vec<AgentKey> = (0..20).collect();
        let mut rng = StdRng::seed_from_u64(1);
        let mut counts = [0_u32; 20];
        let mut out = [0; SAMPLE];
        for _ in 0..20_000 {
            assert_eq!(sample(&usable, &mut out, &mut rng), SAMPLE);
            let mut seen: Vec<AgentKey> = out.to_vec();
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

    /// [`rank`] with every agent's load a count.
    fn rank_loads(
        usable: &[AgentKey],
        load: impl Fn(AgentKey) -> usize,
        rng: &mut StdRng,
    ) -> Vec<AgentKey> {
        rank(usable, |agent| Ok::<_, Infallible>(load(agent)), rng).unwrap_or_else(|n| match n {})
    }

    #[test]
    fn least_loaded_first() {
        let mut rng = StdRng::seed_from_u64(2);
        let usable = [10, 11, 12, 13];
        let got = rank_loads(&usable, |a| [5, 1, 3, 0][(a - 10) as usize], &mut rng);
        assert_eq!(got, vec![13, 11, 12]);
        assert!(rank_loads(&[], |_| 0, &mut rng).is_empty());
    }

    /// Agents without room are passed over for any with room, however the ties fall; when the
    /// first three have none, the worst reason among them is the answer.
    #[test]
    fn agents_without_room_rank_last_and_the_worst_reason_is_the_answer() {
        let mut rng = StdRng::seed_from_u64(3);
        // Ordered mild to worst, as the registry's reasons are.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
        enum NoRoom {
            Busy,
            Full,
        }
        let room = |agent: AgentKey| match agent {
            1 => Err(NoRoom::Full),
            2 => Err(NoRoom::Busy),
            3 => Err(NoRoom::Busy),
            _ => Ok(9),
        };
        for _ in 0..50 {
            assert_eq!(rank(&[1, 2, 3, 4], room, &mut rng), Ok(vec![4]));
        }
        assert_eq!(rank(&[1, 2, 3], room, &mut rng), Err(NoRoom::Full));
        assert_eq!(rank(&[2, 3], room, &mut rng), Err(NoRoom::Busy));
        assert_eq!(rank(&[], room, &mut rng), Ok(vec![]));
    }
}
