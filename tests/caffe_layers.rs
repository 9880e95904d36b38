//! Caffe's Input, Split, Slice, Silence and Deconvolution layers through the real binary: a
//! deploy prototxt (its first layer an Input) imported with `import-caffe`, its weights exported
//! with `export --format caffe` and imported back bit for bit, and `predict` on it giving the
//! probabilities computed by hand below; `train` refuses it (a deploy net has no loss).

mod common;

use common::input_files::npy;
use common::*;
use std::path::Path;

/// Input (1, 1, 2, 2) → Split → Deconvolution (k 2, stride 2: every pixel a 2 × 2 block) →
/// Slice of its rows at 1 → InnerProduct of rows 1..4 → Softmax; Silence takes the rest.
const DEPLOY: &str = r#"name: "deploy"
layer { name: "input" type: "Input" top: "image"
  input_param { shape { dim: 1 dim: 1 dim: 2 dim: 2 } } }
layer { name: "split" type: "Split" bottom: "image" top: "a" top: "b" }
layer { name: "up" type: "Deconvolution" bottom: "a" top: "up"
  convolution_param { num_output: 1 kernel_size: 2 stride: 2 bias_term: false } }
layer { name: "rows" type: "Slice" bottom: "up" top: "row0" top: "rest"
  slice_param { axis: 2 slice_point: 1 } }
layer { name: "ip" type: "InnerProduct" bottom: "rest" top: "ip"
  inner_product_param { num_output: 2 } }
layer { name: "quiet" type: "Silence" bottom: "row0" bottom: "b" }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"#;

/// A float32 `.npy` of `(n, 1, 2, 2)` images.
fn images_npy(images: &[[f32; 4]]) -> Vec<u8> {
    let data: Vec<u8> = images
        .iter()
        .flatten()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    npy("<f4", &format!("({}, 1, 2, 2)", images.len()), &data)
}

fn import(prototxt: &Path, out: &Path, extra: &[&str]) {
    let mut c = std::process::Command::new(bin());
    c.arg("import-caffe")
        .arg(prototxt)
        .args(extra)
        .arg("-o")
        .arg(out);
    ok(&run(&mut c));
}

#[test]
fn a_deploy_net_imports_exports_and_predicts_what_its_layers_compute() {
    let dir = out_dir("caffe_layers_deploy");
    let prototxt = dir.join("deploy.prototxt");
    std::fs::write(&prototxt, DEPLOY).unwrap();

    // Import without weights: the config of the deploy net.
    let first = dir.join("first");
    import(&prototxt, &first, &[]);
    let keys = [
        "format = \"synthetic\"",
        "shape = [1, 2, 2]",
        "type = \"input\"",
        "type = \"deconvolution\"",
        "slice_point = [1]",
        "type = \"silence\"",
    ];
    assert_file_contains(&first.join("cluster.toml"), &keys);

    // The weights: a deconvolution of ones; scores (Σ rest, ½ Σ rest).
    let up = [1.0f32; 4];
    let mut ip = vec![1.0f32; 12];
    ip.extend([0.5f32; 12]);
    let bias = [0.0f32; 2];
    let weights = dir.join("hand.safetensors");
    p2ptrain::snapshot::save_tensors(
        &weights,
        &[
            ("up.weight", &[1, 1, 2, 2], &up),
            ("ip.weight", &[2, 12], &ip),
            ("ip.bias", &[2], &bias),
        ],
        &[],
    )
    .unwrap();

    // Exported to a caffemodel and imported back with the prototxt: the same bits.
    let model = dir.join("hand.caffemodel");
    let mut c = std::process::Command::new(bin());
    c.arg("export")
        .arg(&weights)
        .args(["--format", "caffe", "--config"])
        .arg(first.join("cluster.toml"))
        .arg("-o")
        .arg(&model);
    ok(&run(&mut c));
    let second = dir.join("second");
    import(&prototxt, &second, &["--weights", model.to_str().unwrap()]);
    let imported = second.join("weights.safetensors");
    assert_eq!(tensors(&weights), tensors(&imported));

    // Image x: the deconvolution makes x[r/2][c/2] of a 4 × 4 image; rows 1..4 sum to
    // 2·(x00 + x01) + 4·(x10 + x11) = s, the scores are (s, s/2), p0 = σ(s/2).
    let images = [[0.1, 0.2, -0.3, 0.25], [1.0, -1.0, 0.5, 0.5]];
    let p0 = |x: &[f32; 4]| {
        let s = 2.0 * (x[0] + x[1]) as f64 + 4.0 * (x[2] + x[3]) as f64;
        1.0 / (1.0 + (-s / 2.0).exp())
    };
    let input = dir.join("x.npy");
    std::fs::write(&input, images_npy(&images)).unwrap();
    let out = dir.join("predictions.jsonl");
    let (config, inputs) = (second.join("cluster.toml"), [input.to_str().unwrap()]);
    let args = predict_args(&config, &imported, &out, &inputs, &["--top-k", "2"]);
    let run_out = mpi_p2ptrain(1, &args);
    ok(&run_out);
    let lines = metrics(&out);
    assert_eq!(lines.len(), 2);
    for (line, x) in lines.iter().zip(&images) {
        let top = line["top_k"].as_array().unwrap();
        assert_eq!(top[0]["class"], 0, "{line}");
        let got = top[0]["prob"].as_f64().unwrap();
        assert!((got - p0(x)).abs() < 1e-5, "{got} vs {} in {line}", p0(x));
        let other = top[1]["prob"].as_f64().unwrap();
        assert!((got + other - 1.0).abs() < 1e-5, "{line}");
    }

    // A deploy net has no loss: training it is refused, naming `layer`.
    let train = mpi_p2ptrain(1, &[second.join("cluster.toml").to_str().unwrap()]);
    refused(&train, &["`layer`", "no loss layer"]);
}
