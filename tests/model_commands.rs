//! `p2ptrain test` and `p2ptrain predict` through the real binary under `mpirun`: scoring a
//! snapshot gives the line its training run logged (plus the top-5 accuracy), predictions agree
//! with that score input by input, every input format gives the same classes, and the GPU (where
//! there is one) predicts what the CPU does.

mod common;

use common::input_files::npy;
use common::*;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The digits MLP with a test-phase Accuracy layer, tested only at the end.
fn config(max_iter: u64) -> String {
    let mut c = digits_mlp(
        "",
        &format!("max_iter = {max_iter}\ntest_interval = 0\n"),
        32,
    );
    c.push('\n');
    c.push_str(&config_text::accuracy("ip2"));
    c
}

/// Trains `config(20)` on one rank into a fresh folder `name`: (folder, config, snapshot).
fn trained(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (dir, cfg) = config_dir(name, &config(20));
    ok(&mpi_p2ptrain(
        1,
        &[cfg.to_str().unwrap(), "--output", dir.to_str().unwrap()],
    ));
    let snapshot = dir.join("snap/m_iter_20.safetensors");
    assert!(snapshot.is_file());
    (dir, cfg, snapshot)
}

/// The bundled digits' test images as an IDX file of the repository.
fn test_images() -> String {
    repo("data/digits/test-images-idx3-ubyte.gz")
        .display()
        .to_string()
}

/// The test labels, in order.
fn test_labels() -> Vec<u8> {
    let gz = std::fs::read(repo("data/digits/test-labels-idx1-ubyte.gz")).unwrap();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut raw)
        .unwrap();
    raw[8..].to_vec()
}

/// Runs `test` of `weights` on `np` ranks, logging into `dir`.
fn score(np: usize, cfg: &Path, weights: &Path, dir: &Path) -> std::process::Output {
    let args = [
        "test",
        cfg.to_str().unwrap(),
        "--weights",
        weights.to_str().unwrap(),
    ];
    let dir = dir.to_str().unwrap();
    mpi_p2ptrain(np, &[&args[..], &["--output", dir]].concat())
}

/// Runs `predict` on `np` ranks and returns its lines.
fn predict(
    np: usize,
    cfg: &Path,
    weights: &Path,
    inputs: &[&str],
    out: &Path,
    extra: &[&str],
) -> Vec<serde_json::Value> {
    let run = mpi_p2ptrain(np, &predict_args(cfg, weights, out, inputs, extra));
    assert!(run.status.success(), "{}", text(&run));
    metrics(out)
}

/// [`predict`] of the bundled test images.
fn predict_test_images(
    np: usize,
    cfg: &Path,
    weights: &Path,
    out: &Path,
    extra: &[&str],
) -> Vec<serde_json::Value> {
    predict(np, cfg, weights, &[&test_images()], out, extra)
}

#[test]
fn test_logs_the_line_its_training_run_logged_plus_the_top5() {
    let (dir, cfg, snapshot) = trained("model_test_score");
    let trained_lines = metrics(&dir.join("metrics.jsonl"));
    let trained_test = trained_lines.last().unwrap().clone();
    assert_eq!(trained_test["phase"], "test");
    let out = score(2, &cfg, &snapshot, &dir);
    assert!(out.status.success(), "{}", text(&out));
    let lines = metrics(&dir.join("metrics.jsonl"));
    assert_eq!(lines.len(), trained_lines.len() + 1, "one line appended");
    let scored = lines.last().unwrap();
    assert_eq!(scored["phase"], "test");
    assert_eq!(scored["iter"], 20, "the snapshot's iteration");
    assert_eq!(
        scored["accuracy"], trained_test["accuracy"],
        "exact counts either way"
    );
    let (a, b) = (
        scored["loss"].as_f64().unwrap(),
        trained_test["loss"].as_f64().unwrap(),
    );
    assert!(
        (a - b).abs() < 1e-6 * b.abs().max(1.0),
        "loss {a} vs {b} in training"
    );
    let top5 = scored["accuracy_top5"].as_f64().expect("a top-5 accuracy");
    assert!(
        top5 >= scored["accuracy"].as_f64().unwrap() && top5 <= 1.0,
        "{scored}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("accuracy_top5"), "{stdout}");
    assert_absent(&dir.join("snap/m_iter_0.safetensors"), "no snapshot");
}

/// Predictions on two ranks: one line per test image, in order, whose top class is right
/// exactly as often as `test` says; the top-5 are probabilities, most probable first.
#[test]
fn predictions_agree_with_the_score_input_by_input() {
    let (dir, cfg, snapshot) = trained("model_predict");
    let lines = predict_test_images(2, &cfg, &snapshot, &dir.join("p.jsonl"), &[]);
    let labels = test_labels();
    assert_eq!(lines.len(), labels.len());
    let mut right = 0;
    for (i, (line, &label)) in lines.iter().zip(&labels).enumerate() {
        assert_eq!(line["input"], format!("{}#{i}", test_images()));
        let top = line["top_k"].as_array().unwrap();
        assert_eq!(top.len(), 5);
        let probs: Vec<f64> = top.iter().map(|t| t["prob"].as_f64().unwrap()).collect();
        assert!(probs.windows(2).all(|w| w[0] >= w[1]), "{line}");
        assert!(
            probs.iter().all(|&p| p > 0.0 && p <= 1.0) && probs.iter().sum::<f64>() <= 1.0 + 1e-9
        );
        right += usize::from(top[0]["class"] == label);
    }
    ok(&score(1, &cfg, &snapshot, &dir));
    let scored = metrics(&dir.join("metrics.jsonl")).last().unwrap().clone();
    let acc = scored["accuracy"].as_f64().unwrap();
    assert_eq!(right, (acc * labels.len() as f64).round() as usize);
}

/// The same images as an IDX file and as a NumPy array (two files): the same classes and
/// probabilities, `--top-k` of them.
#[test]
fn npy_inputs_predict_what_the_idx_file_does() {
    let (dir, cfg, snapshot) = trained("model_predict_npy");
    let gz = std::fs::read(test_images()).unwrap();
    let mut idx = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut idx)
        .unwrap();
    let pixels = &idx[16..];
    let npy = |n: usize, data: &[u8]| npy("|u1", &format!("({n}, 1, 8, 8)"), data);
    let (a, b) = (dir.join("a.npy"), dir.join("b.npy"));
    std::fs::write(&a, npy(100, &pixels[..100 * 64])).unwrap();
    std::fs::write(&b, npy(197, &pixels[100 * 64..])).unwrap();
    let from_idx = predict_test_images(1, &cfg, &snapshot, &dir.join("i.jsonl"), &["--top-k", "3"]);
    let from_npy = predict(
        2,
        &cfg,
        &snapshot,
        &[a.to_str().unwrap(), b.to_str().unwrap()],
        &dir.join("n.jsonl"),
        &["--top-k", "3"],
    );
    assert_eq!(from_idx.len(), from_npy.len());
    assert_eq!(from_npy[100]["input"], format!("{}#0", b.display()));
    for (x, y) in from_idx.iter().zip(&from_npy) {
        let (tx, ty) = (
            x["top_k"].as_array().unwrap(),
            y["top_k"].as_array().unwrap(),
        );
        assert_eq!(tx.len(), 3);
        for (p, q) in tx.iter().zip(ty) {
            assert_eq!(p["class"], q["class"], "{x} vs {y}");
            let (p, q) = (p["prob"].as_f64().unwrap(), q["prob"].as_f64().unwrap());
            assert!((p - q).abs() < 1e-6, "{x} vs {y}");
        }
    }
}

#[test]
fn bad_inputs_are_named_with_exit_code_2() {
    let (dir, cfg, snapshot) = trained("model_bad_inputs");
    let predictions = dir.join("p.jsonl");
    let inputs = [dir.to_str().unwrap()];
    let out = mpi_p2ptrain(
        2,
        &predict_args(&cfg, &snapshot, &predictions, &inputs, &[]),
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let all = text(&out);
    assert!(all.contains("LMDB"), "{all}");
    assert_eq!(
        all.matches("LMDB inputs").count(),
        1,
        "reported once: {all}"
    );
    let out = mpi_p2ptrain(1, &["test", cfg.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "test needs --weights: {}",
        text(&out)
    );
}

/// Predictions on a GPU equal the CPU's to rounding; skipped loudly without one.
#[test]
fn the_gpu_predicts_what_the_cpu_does() {
    let gpus = if p2ptrain::cuda::available() {
        p2ptrain::cuda::device_count().unwrap_or(0)
    } else {
        0
    };
    if gpus == 0 || !p2ptrain::cuda::nccl::nccl_available() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED (needs a CUDA device and NCCL; {gpus} device(s)): \
             the_gpu_predicts_what_the_cpu_does"
        );
        return;
    }
    let (dir, cfg, snapshot) = trained("model_predict_gpu");
    let cpu = predict_test_images(1, &cfg, &snapshot, &dir.join("c.jsonl"), &[]);
    let gpu = predict_test_images(
        1,
        &cfg,
        &snapshot,
        &dir.join("g.jsonl"),
        &["--set", "cluster.backend=\"cuda\""],
    );
    assert_eq!(cpu.len(), gpu.len());
    for (x, y) in cpu.iter().zip(&gpu) {
        let (p, q) = (&x["top_k"][0], &y["top_k"][0]);
        let (pp, qp) = (p["prob"].as_f64().unwrap(), q["prob"].as_f64().unwrap());
        assert!((pp - qp).abs() < 1e-4, "{x} vs {y}");
        if (pp - x["top_k"][1]["prob"].as_f64().unwrap()).abs() > 1e-3 {
            assert_eq!(p["class"], q["class"], "{x} vs {y}");
        }
    }
}
