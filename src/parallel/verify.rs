//! Replica consistency checks (`[cluster] verify_interval = N`): every N iterations each replica
//! hashes its flat parameter buffer bit-exactly ([`hash_params`]) and the hashes are gathered on
//! every replica through one all-reduce sum (replica r writes its hash, as two exact 32-bit
//! halves, into slots 2r and 2r+1 of a zeroed vector). Every replica then finds the same
//! verdict ([`check`]): the hash most replicas hold is the reference (universal rank 0's on a
//! tie), and the first universal rank with another hash is named in the error that stops the job.
//!
//! Under local SGD the replicas differ between averagings on purpose; what must agree is checked
//! instead ([`check_among`]): the outer rule's state on every replica, and the parameters among
//! the replicas of each node (`sync_scope = "node"`) or, right after an averaging, everywhere.

use crate::error::{Error, Result};

/// FNV-1a (64 bits) over the bit patterns of `data`, one 32-bit word per step: equal only for
/// bit-identical buffers (up to hash collisions), the same on every machine.
pub fn hash_params(data: &[f32]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    data.iter()
        .fold(OFFSET, |h, w| (h ^ w.to_bits() as u64).wrapping_mul(PRIME))
}

/// The all-reduce input of replica `rank` of `size`: its hash in slots `2·rank`, `2·rank + 1`.
pub fn gather_slots(hash: u64, rank: usize, size: usize) -> Vec<f64> {
    let mut v = vec![0.0; 2 * size];
    v[2 * rank] = (hash >> 32) as f64;
    v[2 * rank + 1] = (hash & 0xffff_ffff) as f64;
    v
}

/// The hashes back from the summed slots.
pub fn hashes(summed: &[f64]) -> Vec<u64> {
    summed
        .chunks_exact(2)
        .map(|p| ((p[0] as u64) << 32) | p[1] as u64)
        .collect()
}

/// `Ok` when every replica holds the same hash, else an error naming the first universal rank
/// whose hash differs from the majority's and the iteration.
pub fn check(hashes: &[u64], iter: u64) -> Result<()> {
    let all: Vec<usize> = (0..hashes.len()).collect();
    check_among(&all, hashes, iter, "parameters", "replicas")
}

/// [`check`] among the universal ranks `ranks` only, of every replica's `hashes`, saying what
/// was hashed (`what`: "parameters") and of which replicas (`among`: "replicas of node 1").
pub fn check_among(
    ranks: &[usize],
    hashes: &[u64],
    iter: u64,
    what: &str,
    among: &str,
) -> Result<()> {
    let Some(&first) = ranks.first().map(|&r| &hashes[r]) else {
        return Ok(());
    };
    if ranks.iter().all(|&r| hashes[r] == first) {
        return Ok(());
    }
    let count = |h: u64| ranks.iter().filter(|&&r| hashes[r] == h).count();
    // The most common hash; the earliest rank's on a tie (rank 0's with two replicas).
    let reference =
        ranks.iter().map(|&r| hashes[r]).fold(
            first,
            |best, h| {
                if count(h) > count(best) {
                    h
                } else {
                    best
                }
            },
        );
    let bad: Vec<usize> = ranks
        .iter()
        .copied()
        .filter(|&r| hashes[r] != reference)
        .collect();
    Err(Error::Comm(format!(
        "replica consistency check after iteration {iter}: the {what} of universal rank {} \
         differ from those of {} of {} {among} (hash {:016x}, expected {reference:016x}); \
         diverging ranks: {bad:?}",
        bad[0],
        count(reference),
        ranks.len(),
        hashes[bad[0]],
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_sees_one_ulp_and_round_trips_through_the_slots() {
        let a = [1.0f32, -2.5, 0.0];
        let mut b = a;
        b[2] = f32::from_bits(1);
        assert_ne!(hash_params(&a), hash_params(&b));
        assert_eq!(hash_params(&a), hash_params(&a.clone()));
        let (ha, hb) = (hash_params(&a), hash_params(&b));
        let mut sum = gather_slots(ha, 0, 3);
        for (s, x) in sum.iter_mut().zip(gather_slots(hb, 1, 3)) {
            *s += x;
        }
        for (s, x) in sum.iter_mut().zip(gather_slots(ha, 2, 3)) {
            *s += x;
        }
        assert_eq!(hashes(&sum), [ha, hb, ha]);
    }

    #[test]
    fn names_the_diverging_rank() {
        assert!(check(&[7, 7, 7], 3).is_ok());
        let e = check(&[7, 7, 9, 7], 12).unwrap_err().to_string();
        assert!(e.contains("universal rank 2 differ"), "{e}");
        assert!(e.contains("after iteration 12"), "{e}");
        // Rank 0 itself diverging is named, not its healthy peers.
        let e = check(&[5, 7, 7], 4).unwrap_err().to_string();
        assert!(e.contains("universal rank 0 differ"), "{e}");
        assert!(e.contains("diverging ranks: [0]"), "{e}");
    }

    /// Among a node's replicas only: the other node may differ, a replica of this one may not.
    #[test]
    fn checks_among_a_group_of_ranks() {
        let hashes = [1, 1, 8, 9];
        assert!(check_among(&[0, 1], &hashes, 5, "parameters", "replicas of node 0").is_ok());
        let e = check_among(&[2, 3], &hashes, 5, "parameters", "replicas of node 1")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("universal rank 3 differ from those of 1 of 2 replicas of node 1"),
            "{e}"
        );
    }
}
