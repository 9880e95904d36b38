//! `Blob`: an activation tensor with its gradient, row-major, shape `(N, ...)` with the batch first.

/// An activation (data) and its gradient (diff), both `count()` floats, row-major over `shape`.
#[derive(Debug, Clone, Default)]
pub struct Blob {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    pub diff: Vec<f32>,
}

impl Blob {
    /// A zero blob of `shape`.
    pub fn new(shape: &[usize]) -> Self {
        let mut b = Blob::default();
        b.reshape(shape);
        b
    }

    /// Changes the shape; keeps the allocation when it is large enough. Contents become unspecified
    /// (zero where the blob grew).
    pub fn reshape(&mut self, shape: &[usize]) {
        self.shape = shape.to_vec();
        let n = shape.iter().product();
        self.data.resize(n, 0.0);
        self.diff.resize(n, 0.0);
    }

    /// Number of elements.
    pub fn count(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size of the first (batch) axis; 1 for a scalar.
    pub fn num(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Elements per batch item: `count() / num()`.
    pub fn inner(&self) -> usize {
        self.shape.iter().skip(1).product()
    }
}
