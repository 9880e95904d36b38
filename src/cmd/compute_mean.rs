//! `p2ptrain compute-mean`: the per-pixel mean image of a config's training set, written as a
//! Caffe `mean.binaryproto` for `data.mean_file` (what Caffe's `compute_image_mean` does). One
//! process, no MPI: the records are read raw (before any transform) and averaged in double.
//!
//! Shapes: records `(C, H, W)`; the image has the same shape.

use crate::data::mean_file::{self, MeanImage};
use crate::data::{self, RecordSource};
use crate::error::Result;
use crate::validate;
use std::path::PathBuf;

/// What `p2ptrain compute-mean` was asked.
#[derive(Debug, Clone)]
pub struct MeanOptions {
    /// The config whose `[data]` names the training set.
    pub config: PathBuf,
    /// `--set` overrides, as for training.
    pub sets: Vec<String>,
    /// The file to write.
    pub output: PathBuf,
}

/// Computes and writes the mean image; returns the exit code (2 for a bad config or data file,
/// 1 when the file cannot be written).
pub fn run(opts: &MeanOptions) -> i32 {
    match compute(opts) {
        Ok((image, records)) => {
            let channels: Vec<String> = channel_means(&image)
                .iter()
                .map(|m| format!("{m:.3}"))
                .collect();
            println!(
                "mean image {} of {records} training records written to {} (channel means {})",
                data::fmt_shape(image.shape),
                opts.output.display(),
                channels.join(", ")
            );
            0
        }
        Err(e) => {
            eprintln!("p2ptrain: error: {e}");
            e.exit_code()
        }
    }
}

/// Returns the image written and the number of records it averages.
fn compute(opts: &MeanOptions) -> Result<(MeanImage, usize)> {
    let (cfg, _) = validate::load(&opts.config, &opts.sets)?;
    let (train, _) = data::open_sources(&cfg.data, cfg.solver.random_seed, 1)?;
    let image = mean_of(train.as_ref())?;
    mean_file::write(&opts.output, &image)?;
    Ok((image, train.len()))
}

/// The per-pixel mean of every record of `source` (summed in double, in record order); an error
/// names a record that cannot be read.
pub fn mean_of(source: &dyn RecordSource) -> Result<MeanImage> {
    let shape = source.record_shape();
    let size: usize = shape.iter().product();
    let mut sums = vec![0f64; size];
    let mut record = vec![0f32; size];
    for i in 0..source.len() {
        source.try_fill(i, &mut record)?;
        sums.iter_mut()
            .zip(&record)
            .for_each(|(s, &v)| *s += f64::from(v));
    }
    let n = source.len().max(1) as f64;
    Ok(MeanImage {
        shape,
        data: sums.iter().map(|s| (s / n) as f32).collect(),
    })
}

/// `(C)` the mean of each channel of `image`.
fn channel_means(image: &MeanImage) -> Vec<f64> {
    let plane = image.shape[1] * image.shape[2];
    image
        .data
        .chunks_exact(plane.max(1))
        .map(|p| p.iter().map(|&v| f64::from(v)).sum::<f64>() / plane as f64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::data::test_util::FnSource;

    #[test]
    fn averages_every_record_per_pixel() {
        // Three 1×1×2 records: (0, 10), (1, 20), (5, 60).
        let three = FnSource::new(3, [1, 1, 2], |i, out: &mut [f32]| {
            out.copy_from_slice(&[[0.0, 10.0], [1.0, 20.0], [5.0, 60.0]][i])
        });
        let image = mean_of(&three).unwrap();
        assert_eq!(image.shape, [1, 1, 2]);
        assert_eq!(image.data, vec![2.0, 30.0]);
        assert_eq!(channel_means(&image), vec![16.0]);
    }
}
