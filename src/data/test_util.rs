//! What the tests of the data pipeline share: [`FnSource`], a record source written by a
//! closure, for tests that need records of a known content without a file.

use super::RecordSource;

/// `len` records of `shape` in 2 classes, record `i` written by `fill(i, out)`; labelled 0 unless
/// [`FnSource::labelled`] says otherwise; read without decode workers unless
/// [`FnSource::with_workers`] gives it some.
pub(crate) struct FnSource<F> {
    len: usize,
    shape: [usize; 3],
    fill: F,
    label: fn(usize) -> u32,
    workers: Option<rayon::ThreadPool>,
    /// Whether `fill` writes whole 8-bit values ([`FnSource::of_u8`]).
    u8_values: bool,
}

impl<F: Fn(usize, &mut [f32]) + Send + Sync> FnSource<F> {
    pub(crate) fn new(len: usize, shape: [usize; 3], fill: F) -> Self {
        FnSource {
            len,
            shape,
            fill,
            label: |_| 0,
            workers: None,
            u8_values: false,
        }
    }

    /// The same records behind a pool of `threads` decode workers, as an image source has.
    pub(crate) fn with_workers(self, threads: usize) -> Self {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("starting the test's decode workers");
        FnSource {
            workers: Some(pool),
            ..self
        }
    }

    /// The same records, declared 8-bit ([`RecordSource::values_are_u8`]): `fill` must write
    /// whole values 0 to 255.
    pub(crate) fn of_u8(self) -> Self {
        FnSource {
            u8_values: true,
            ..self
        }
    }

    /// The same records, record `i` labelled `label(i)`.
    pub(crate) fn labelled(self, label: fn(usize) -> u32) -> Self {
        FnSource { label, ..self }
    }
}

impl<F: Fn(usize, &mut [f32]) + Send + Sync> RecordSource for FnSource<F> {
    fn len(&self) -> usize {
        self.len
    }
    fn record_shape(&self) -> [usize; 3] {
        self.shape
    }
    fn classes(&self) -> usize {
        2
    }
    fn fill(&self, index: usize, out: &mut [f32]) {
        (self.fill)(index, out)
    }
    fn label(&self, index: usize) -> u32 {
        (self.label)(index)
    }
    fn workers(&self) -> Option<&rayon::ThreadPool> {
        self.workers.as_ref()
    }
    fn values_are_u8(&self) -> bool {
        self.u8_values
    }
}
