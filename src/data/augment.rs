//! Training-time augmentation: a random translation of each record by up to `shift` pixels in
//! each direction, the uncovered border filled with the normalised value of a zero pixel. The
//! offsets of the record at stream position `p` come from a hash of (seed, p) alone, so the same
//! record at the same position is shifted the same way whatever the topology.

use super::order::splitmix64;

const AUGMENT_SALT: u64 = 0x5348_4946_5431_0001; // "SHIFT1"

/// A record translation; `shift = 0` leaves records untouched.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Augment {
    /// Largest offset, in pixels, along H and along W.
    pub shift: usize,
    pub seed: u64,
    /// Value of the uncovered pixels: `(0 − mean) · scale`.
    pub fill: f32,
}

impl Augment {
    /// No augmentation.
    pub fn none() -> Self {
        Augment::default()
    }

    /// The offsets `(dy, dx)`, each in `−shift..=shift`, of the record at stream position `p`.
    pub fn offsets(&self, position: u64) -> (isize, isize) {
        let span = 2 * self.shift as u64 + 1;
        let h = splitmix64(splitmix64(self.seed ^ AUGMENT_SALT) ^ position);
        let dy = (h % span) as isize - self.shift as isize;
        let dx = ((h >> 32) % span) as isize - self.shift as isize;
        (dy, dx)
    }

    /// Translates `record` (C, H, W) in place: `out[c][y][x] = in[c][y − dy][x − dx]`.
    pub fn apply(
        &self,
        position: u64,
        shape: [usize; 3],
        record: &mut [f32],
        scratch: &mut Vec<f32>,
    ) {
        if self.shift == 0 {
            return;
        }
        let (dy, dx) = self.offsets(position);
        if dy == 0 && dx == 0 {
            return;
        }
        let [_, h, w] = shape;
        scratch.clear();
        scratch.extend_from_slice(record);
        for (out, src) in record
            .chunks_exact_mut(h * w)
            .zip(scratch.chunks_exact(h * w))
        {
            for y in 0..h {
                let sy = y as isize - dy;
                let row = &mut out[y * w..(y + 1) * w];
                if sy < 0 || sy >= h as isize {
                    row.fill(self.fill);
                    continue;
                }
                let src_row = &src[sy as usize * w..(sy as usize + 1) * w];
                for (x, o) in row.iter_mut().enumerate() {
                    let sx = x as isize - dx;
                    *o = if sx < 0 || sx >= w as isize {
                        self.fill
                    } else {
                        src_row[sx as usize]
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translation_moves_pixels_and_fills_the_border() {
        let a = Augment {
            shift: 1,
            seed: 3,
            fill: -1.0,
        };
        // Find positions with each offset and check one by hand.
        let (p, (dy, dx)) = (0..1000u64)
            .map(|p| (p, a.offsets(p)))
            .find(|(_, o)| *o == (1, -1))
            .expect("offset (1, -1) occurs");
        assert_eq!((dy, dx), (1, -1));
        let mut rec: Vec<f32> = (0..9).map(|v| v as f32).collect(); // 1×3×3
        a.apply(p, [1, 3, 3], &mut rec, &mut Vec::new());
        // Down by one, left by one.
        assert_eq!(rec, vec![-1.0, -1.0, -1.0, 1.0, 2.0, -1.0, 4.0, 5.0, -1.0]);
    }

    #[test]
    fn offsets_cover_the_range_and_depend_on_seed_and_position_only() {
        let a = Augment {
            shift: 2,
            seed: 9,
            fill: 0.0,
        };
        let mut seen = std::collections::HashSet::new();
        for p in 0..2000 {
            let (dy, dx) = a.offsets(p);
            assert!((-2..=2).contains(&dy) && (-2..=2).contains(&dx));
            seen.insert((dy, dx));
            assert_eq!(a.offsets(p), a.offsets(p));
        }
        assert_eq!(seen.len(), 25);
        let b = Augment { seed: 10, ..a };
        assert!((0..100).any(|p| a.offsets(p) != b.offsets(p)));
    }

    #[test]
    fn no_shift_is_the_identity() {
        let mut rec = vec![1.0, 2.0, 3.0, 4.0];
        Augment::none().apply(5, [1, 2, 2], &mut rec, &mut Vec::new());
        assert_eq!(rec, vec![1.0, 2.0, 3.0, 4.0]);
    }
}
