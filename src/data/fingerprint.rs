//! Fingerprints of what the data sources hold, compared across ranks at start-up. Ranks that
//! read node-local copies of a data set must read the same records, or training goes on without
//! a word and the topology invariance breaks. A fingerprint covers the record count, shape and
//! classes, every label, and the values (as the source yields them) of up to
//! [`SAMPLED_RECORDS`] records spread evenly over the set — all of them in a set that small.
//!
//! ```text
//! rank 0: train 64 records, 5f3a…   rank 1: train 48 records, 91c0…
//!   → data/train.bin: rank 1 reads other training records here than rank 0 (48 records, rank 0 64)
//! ```

use super::{record_size, DataSplit, RecordSource};
use crate::error::{Error, Result};

/// Records whose values enter a fingerprint, at most.
pub const SAMPLED_RECORDS: usize = 256;

/// What one rank sees of one half of the data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcePrint {
    /// The source's name in messages (its file).
    pub name: String,
    pub records: u64,
    pub hash: u64,
}

/// Compares what every rank's `split` holds; `all_gather` returns every rank's words (of one
/// length), concatenated in rank order. The error names the file and the ranks that differ.
pub fn check_across_ranks(
    split: &DataSplit,
    all_gather: impl FnOnce(&[u64]) -> Vec<u64>,
) -> Result<()> {
    let mine = prints(split);
    let all: Vec<[u64; 4]> = all_gather(&to_words(&mine))
        .chunks_exact(4)
        .map(|c| [c[0], c[1], c[2], c[3]])
        .collect();
    check_same(&mine, &all)
}

/// The training and test halves' prints of `split`, in that order.
pub fn prints(split: &DataSplit) -> [SourcePrint; 2] {
    [print(split.train.as_ref()), print(split.test.as_ref())]
}

/// The print of one source (see the module docs).
pub fn print(source: &dyn RecordSource) -> SourcePrint {
    let n = source.len();
    let mut h = Fnv::default();
    h.add(n as u64);
    for d in source.record_shape() {
        h.add(d as u64);
    }
    h.add(source.classes() as u64);
    for i in 0..n {
        h.add(source.label(i) as u64);
    }
    let mut words = Vec::with_capacity(record_size(source));
    for i in (0..n).step_by(n.div_ceil(SAMPLED_RECORDS).max(1)) {
        words.clear();
        source.print_words(i, &mut words);
        h.add(i as u64);
        words.iter().for_each(|&w| h.add(w));
    }
    SourcePrint {
        name: source.name().to_string(),
        records: n as u64,
        hash: h.0,
    }
}

/// The numbers a rank sends for `prints`: records and hash of each half.
pub fn to_words(prints: &[SourcePrint; 2]) -> [u64; 4] {
    [
        prints[0].records,
        prints[0].hash,
        prints[1].records,
        prints[1].hash,
    ]
}

/// Compares every rank's [`to_words`] (`all`, in rank order) with rank 0's; `mine` names the
/// files. The error ([`Error::Data`], exit 2) names the first half that differs, its file and
/// the ranks that read something else there.
pub fn check_same(mine: &[SourcePrint; 2], all: &[[u64; 4]]) -> Result<()> {
    let Some(first) = all.first() else {
        return Ok(());
    };
    for (half, what) in ["training", "test"].iter().enumerate() {
        let at = 2 * half;
        let differ: Vec<usize> = (0..all.len())
            .filter(|&r| all[r][at..at + 2] != first[at..at + 2])
            .collect();
        if differ.is_empty() {
            continue;
        }
        let what_they_read: Vec<String> = differ
            .iter()
            .map(|&r| match all[r][at] {
                n if n == first[at] => format!("rank {r}: other labels or values"),
                n => format!("rank {r}: {n} records"),
            })
            .collect();
        let ranks = if differ.len() == 1 { "rank" } else { "ranks" };
        let list: Vec<String> = differ.iter().map(|r| r.to_string()).collect();
        return Err(Error::data(
            &mine[half].name,
            format!(
                "{ranks} {} read other {what} data here than rank 0 ({}; rank 0: {} records): \
                 every rank must read the same data (a node-local copy out of date?)",
                list.join(", "),
                what_they_read.join(", "),
                first[at]
            ),
        ));
    }
    Ok(())
}

/// FNV-1a over 64-bit words and bytes: stable across processes, builds and machines.
pub(crate) struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    pub(crate) fn add(&mut self, word: u64) {
        word.to_le_bytes().iter().for_each(|&b| self.add_byte(b));
    }

    pub(crate) fn add_byte(&mut self, b: u8) {
        self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }

    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Split, SyntheticSource};

    fn words(records: u64, hash: u64) -> [u64; 4] {
        [records, hash, 16, 7]
    }

    fn mine() -> [SourcePrint; 2] {
        let p = |name: &str| SourcePrint {
            name: name.into(),
            records: 0,
            hash: 0,
        };
        [p("train.bin"), p("test.bin")]
    }

    #[test]
    fn equal_prints_pass() {
        let all = [words(64, 1), words(64, 1), words(64, 1)];
        assert!(check_same(&mine(), &all).is_ok());
        assert!(check_same(&mine(), &[]).is_ok());
    }

    #[test]
    fn a_rank_with_fewer_or_other_records_is_named_with_the_file() {
        let all = [words(64, 1), words(64, 1), words(48, 2), words(64, 3)];
        let err = check_same(&mine(), &all).unwrap_err().to_string();
        assert!(
            err.starts_with("train.bin: ranks 2, 3 read other training data"),
            "{err}"
        );
        assert!(err.contains("rank 2: 48 records"), "{err}");
        assert!(err.contains("rank 3: other labels or values"), "{err}");
        assert_eq!(
            Error::data("x", "").exit_code(),
            2,
            "bad input: exit code 2"
        );
    }

    #[test]
    fn the_test_half_is_compared_too() {
        let mut other = words(64, 1);
        other[3] = 8;
        let err = check_same(&mine(), &[words(64, 1), other])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("test.bin: rank 1 read other test data"),
            "{err}"
        );
    }

    #[test]
    fn the_print_follows_the_records() {
        let source =
            |n: usize, seed: u64| SyntheticSource::new([1, 4, 4], 3, n, seed, Split::Train);
        let a = print(&source(40, 1));
        assert_eq!(a, print(&source(40, 1)), "stable");
        assert_eq!(a.records, 40);
        assert_ne!(a.hash, print(&source(39, 1)).hash, "record count");
        assert_ne!(a.hash, print(&source(40, 2)).hash, "values");
    }
}
