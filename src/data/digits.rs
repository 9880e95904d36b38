//! The handwritten-digit set bundled in the binary (`data/digits`: 1500 training and 297 test
//! images of 1×8×8, 10 classes, gzip-compressed IDX), read through the IDX code.

use super::idx::IdxSource;
use crate::error::Result;

const TRAIN_IMAGES: &[u8] = include_bytes!("../../data/digits/train-images-idx3-ubyte.gz");
const TRAIN_LABELS: &[u8] = include_bytes!("../../data/digits/train-labels-idx1-ubyte.gz");
const TEST_IMAGES: &[u8] = include_bytes!("../../data/digits/test-images-idx3-ubyte.gz");
const TEST_LABELS: &[u8] = include_bytes!("../../data/digits/test-labels-idx1-ubyte.gz");

/// The bundled training and test sets, as `(pixel − mean) · scale`.
pub(crate) fn open(classes: usize, mean: f32, scale: f32) -> Result<(IdxSource, IdxSource)> {
    let train = IdxSource::from_bytes(
        "digits:train-images-idx3-ubyte.gz",
        TRAIN_IMAGES,
        "digits:train-labels-idx1-ubyte.gz",
        TRAIN_LABELS,
        classes,
        mean,
        scale,
    )?;
    let test = IdxSource::from_bytes(
        "digits:test-images-idx3-ubyte.gz",
        TEST_IMAGES,
        "digits:test-labels-idx1-ubyte.gz",
        TEST_LABELS,
        classes,
        mean,
        scale,
    )?;
    Ok((train, test))
}
