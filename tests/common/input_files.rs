//! The input files the tests write, byte for byte as their own tools write them: NumPy `.npy`
//! arrays, IDX label files, gzip. Shared by the integration tests (`common::input_files`) and
//! the crate's unit tests (`crate::input_files`, compiled from this file in test builds only),
//! so it names nothing of either.

#![allow(dead_code)]

use std::io::Write;

/// A NumPy v1.0 `.npy` file of the element type `descr` (e.g. `<f4`, `|u1`) and the `shape`
/// (Python's tuple text, e.g. `(2, 1, 8, 8)`): the header padded to 64 bytes as NumPy writes it,
/// then the raw `data`.
pub fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(header.len() as u16).to_le_bytes());
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    b
}

/// A raw IDX label file of `n` labels, label `i` being `i mod 10`.
pub fn idx_labels(n: u32) -> Vec<u8> {
    let mut b = 0x0801u32.to_be_bytes().to_vec();
    b.extend_from_slice(&n.to_be_bytes());
    b.extend((0..n).map(|i| (i % 10) as u8));
    b
}

/// `bytes` compressed as a gzip file.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}
