//! The parsers of untrusted input never panic: thousands of mutated versions of valid config,
//! IDX and CIFAR-10 inputs (bit flips, interesting bytes, truncations, insertions, deletions,
//! duplicated ranges, random bytes), drawn from a fixed-seed generator, go through the entry
//! points the fuzz targets use (`p2ptrain::inputs`). Deterministic and fast: it runs in
//! `cargo test`, so CI covers the parsers without cargo-fuzz. An input that makes a parser panic
//! (a cargo-fuzz artifact) belongs here as a regression test named after the bug; none so far.

mod common;

use common::input_files::{gzip, idx_labels};
use common::{config_text, repo};
use p2ptrain::inputs;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// One random edit of `input`.
fn mutate(rng: &mut ChaCha8Rng, input: &[u8]) -> Vec<u8> {
    const INTERESTING: &[u8] = b"\x00\x01\x08\x09\x0a\x7f\x80\xff0123456789[]{}=\".,-+eE_\n #";
    let mut v = input.to_vec();
    let edits = rng.gen_range(1..=4);
    for _ in 0..edits {
        let len = v.len();
        match rng.gen_range(0..8) {
            0 if len > 0 => {
                let i = rng.gen_range(0..len);
                v[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.gen_range(0..len);
                v[i] = INTERESTING[rng.gen_range(0..INTERESTING.len())];
            }
            2 => v.truncate(rng.gen_range(0..=len)),
            3 => {
                let at = rng.gen_range(0..=len);
                let n = rng.gen_range(1..=16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                v.splice(at..at, bytes);
            }
            4 if len > 0 => {
                let a = rng.gen_range(0..len);
                let b = rng.gen_range(a..=len.min(a + 64));
                v.drain(a..b);
            }
            5 if len > 0 => {
                let a = rng.gen_range(0..len);
                let b = rng.gen_range(a..=len.min(a + 64));
                let piece = v[a..b].to_vec();
                let at = rng.gen_range(0..=v.len());
                v.splice(at..at, piece);
            }
            6 => {
                let n = rng.gen_range(0..256);
                v = (0..n).map(|_| rng.gen()).collect();
            }
            _ if len >= 4 => {
                // A big-endian u32 field set to an extreme value.
                let i = rng.gen_range(0..len - 3);
                let x: u32 = [0, 1, 0xffff_ffff, 0x8000_0000, 3073, rng.gen()][rng.gen_range(0..6)];
                v[i..i + 4].copy_from_slice(&x.to_be_bytes());
            }
            _ => v.push(rng.gen()),
        }
    }
    v
}

/// Feeds `count` mutations of each seed to `parse`; panics (naming the input) if `parse` does,
/// and unless some mutations were accepted and some rejected (the mutations reach the parser's
/// checks without destroying every input).
fn fuzz(
    what: &str,
    seeds: &[Vec<u8>],
    count: usize,
    seed: u64,
    parse: fn(&[u8]) -> p2ptrain::error::Result<()>,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut ok, mut err) = (0, 0);
    for k in 0..count {
        let base = &seeds[k % seeds.len()];
        let input = mutate(&mut rng, base);
        match catch_unwind(AssertUnwindSafe(|| parse(&input))) {
            Ok(Ok(())) => ok += 1,
            Ok(Err(_)) => err += 1,
            Err(_) => panic!(
                "{what}: the parser panicked on mutation {k} (seed {seed}) of {} bytes: {:?}",
                input.len(),
                String::from_utf8_lossy(&input)
            ),
        }
    }
    eprintln!("{what}: {count} mutations, {ok} accepted, {err} rejected with an error");
    assert!(ok > 0 && err > 0, "{what}: {ok} accepted, {err} rejected");
}

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// A synthetic config that validates without files, with the transform keys.
fn synthetic() -> String {
    format!(
        r#"[data]
format = "synthetic"
shape = [3, 8, 8]
classes = 4
train_size = 64
test_size = 16
batch_size = 8
crop_size = 6
mirror = true
mean_value = [0.5, 0.4, 0.3]
scale = 2.0
shift = 1

[solver]
base_lr = 0.1
max_iter = 10
lr_policy = "step"
gamma = 0.5
stepsize = 3

{}"#,
        config_text::linear_classifier("data", 4, "")
    )
}

#[test]
fn mutated_configs_never_panic() {
    let mut seeds = vec![
        read("config/quickstart.toml"),
        read("config/mlp4096.toml"),
        read("tests/configs/equivalence.toml"),
        synthetic().into_bytes(),
        synthetic()
            .replace(
                "format = \"synthetic\"\nshape = [3, 8, 8]",
                "format = \"cifar10\"\ntrain_files = [\"a.bin\"]\ntest_files = [\"b.bin\"]",
            )
            .into_bytes(),
    ];
    // The valid seeds are accepted: the entry point does parse.
    for s in &seeds[..4] {
        inputs::config(s).unwrap_or_else(|e| panic!("a valid seed is refused: {e}"));
    }
    if let Ok(dir) = std::fs::read_dir(repo("tests/configs/bad")) {
        let mut bad: Vec<_> = dir.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        bad.sort();
        seeds.extend(
            bad.iter()
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .filter_map(|p| std::fs::read(p).ok()),
        );
    }
    fuzz("config", &seeds, 4000, 1, inputs::config);
}

/// A raw IDX image file of `n` images of h×w.
fn idx_images(n: u32, h: u32, w: u32) -> Vec<u8> {
    let mut b = 0x0803u32.to_be_bytes().to_vec();
    for d in [n, h, w] {
        b.extend_from_slice(&d.to_be_bytes());
    }
    b.extend((0..n * h * w).map(|j| (j % 251) as u8));
    b
}

#[test]
fn mutated_idx_files_never_panic() {
    // An image file followed by its label file.
    let mut pair = idx_images(4, 2, 3);
    pair.extend_from_slice(&idx_labels(4));
    let seeds = vec![
        idx_images(3, 4, 5),
        idx_labels(7),
        gzip(&idx_images(2, 3, 3)),
        gzip(&idx_labels(5)),
        pair.clone(),
        read("data/digits/test-labels-idx1-ubyte.gz"),
    ];
    for s in &seeds[..4] {
        let _ = inputs::idx(s);
    }
    assert!(inputs::idx(&idx_labels(7)).is_ok());
    let e = inputs::idx(&pair).unwrap_err().to_string();
    assert!(e.contains("bytes after the data"), "{e}"); // not one file, but a pair
    fuzz("idx", &seeds, 4000, 2, inputs::idx);
}

/// `n` CIFAR-10 records.
fn cifar(n: usize) -> Vec<u8> {
    let mut b = Vec::new();
    for i in 0..n {
        b.push((i % 10) as u8);
        b.extend((0..3072).map(|j| ((i * 5 + j) % 256) as u8));
    }
    b
}

#[test]
fn mutated_cifar10_files_never_panic() {
    let seeds = vec![cifar(1), cifar(3), cifar(2)[..3000].to_vec()];
    inputs::cifar10(&seeds[1]).unwrap();
    fuzz("cifar10", &seeds, 3000, 3, inputs::cifar10);
}

#[test]
fn mutated_mean_files_never_panic() {
    let seeds = vec![read("fuzz/seeds/mean_file/digits.binaryproto")];
    inputs::mean_file(&seeds[0]).unwrap();
    fuzz("mean_file", &seeds, 3000, 4, inputs::mean_file);
}

#[test]
fn mutated_caffe_prototxts_never_panic() {
    let net = read("tests/data/caffe/digits_lenet_train_test.prototxt");
    let solver = read("tests/data/caffe/digits_lenet_solver_50.prototxt");
    inputs::caffe_net(&net).unwrap();
    inputs::caffe_solver(&solver).unwrap();
    fuzz("caffe_net", &[net], 3000, 5, inputs::caffe_net);
    fuzz("caffe_solver", &[solver], 3000, 6, inputs::caffe_solver);
}

#[test]
fn mutated_caffemodels_never_panic() {
    use p2ptrain::caffe::proto::{BlobProto, LayerParameter, NetParameter};
    use prost::Message;
    let layer = |name: &str, shapes: &[&[usize]]| LayerParameter {
        name: Some(name.into()),
        r#type: Some("InnerProduct".into()),
        blobs: shapes
            .iter()
            .map(|s| BlobProto::with_shape(s, &vec![0.5; s.iter().product()]))
            .collect(),
        ..Default::default()
    };
    let model = NetParameter {
        name: Some("n".into()),
        layer: vec![
            layer("ip1", &[&[4, 3], &[4]]),
            layer("ip2", &[&[2, 4], &[2]]),
        ],
        ..Default::default()
    };
    let seeds = vec![model.encode_to_vec()];
    inputs::caffemodel(&seeds[0]).unwrap();
    fuzz("caffemodel", &seeds, 3000, 7, inputs::caffemodel);
}

#[test]
fn mutated_npy_arrays_never_panic() {
    let npy = |descr: &str, shape: &str, data: &[u8]| {
        let header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}\n");
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(header.len() as u16).to_le_bytes());
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        b
    };
    let seeds = vec![
        npy("|u1", "(2, 1, 2, 3)", &[7; 12]),
        npy("<f4", "(3, 2, 2)", &[0x3f; 48]),
    ];
    for s in &seeds {
        inputs::npy(s).unwrap();
    }
    fuzz("npy", &seeds, 3000, 8, inputs::npy);
}

#[test]
fn mutated_jpegs_and_pngs_never_panic() {
    let seeds: Vec<Vec<u8>> = [
        "colour_baseline.jpg",
        "colour_progressive.jpg",
        "grey.jpg",
        "digit.png",
    ]
    .iter()
    .map(|f| read(&format!("fuzz/seeds/image/{f}")))
    .collect();
    for s in &seeds {
        inputs::image(s).unwrap();
    }
    fuzz("image", &seeds, 1500, 5, inputs::image);
}

#[test]
fn mutated_datums_never_panic() {
    let seeds = vec![
        read("fuzz/seeds/datum/raw.datum"),
        read("fuzz/seeds/datum/encoded.datum"),
    ];
    for s in &seeds {
        inputs::datum(s).unwrap();
    }
    fuzz("datum", &seeds, 3000, 6, inputs::datum);
}
