//! `import-caffe` and `export --format caffe` against what BVLC Caffe itself made
//! (`tests/data/caffe/`, copied from the project's Caffe references: a LeNet-style net and solver
//! on the bundled digits, Caffe's initial, 50-iteration and 600-iteration caffemodels, the log
//! of the 50 iterations with the loss of each, and a float64 NumPy forward pass of the final
//! weights over the 297 test digits, `numpy_check.txt`).
//!
//! Caffe trained from LMDBs that hold the digits' IDX files record for record, in IDX order
//! (its Data layer reads in order). The imported config is run both on those LMDBs, as Caffe
//! read them, and with its `[data]` pointed at the IDX files (`data/digits/`): the same records
//! in the same order.

mod common;

use common::*;
use std::path::{Path, PathBuf};

/// The Caffe files of the tests.
fn caffe(name: &str) -> String {
    repo(&format!("tests/data/caffe/{name}"))
        .display()
        .to_string()
}

/// `p2ptrain import-caffe` of the digits net with `args`, into a fresh `dir`.
fn import(dir: &Path, args: &[&str]) -> std::process::Output {
    import_net(&caffe("digits_lenet_train_test.prototxt"), dir, args)
}

/// `p2ptrain import-caffe` of the net `net` with `args`, into a fresh `dir`.
fn import_net(net: &str, dir: &Path, args: &[&str]) -> std::process::Output {
    let mut c = std::process::Command::new(bin());
    c.arg("import-caffe").arg(net).args(args).arg("-o").arg(dir);
    run(&mut c)
}

/// Exports `snapshot` to a `.caffemodel` beside it, imports that with the net `net` into the
/// fresh folder `back`, and asserts that every tensor comes back bit for bit.
fn assert_exports_back_bitwise(snapshot: &Path, net: &str, back: &str) {
    let exported = snapshot.with_extension("caffemodel");
    let mut c = std::process::Command::new(bin());
    c.args([
        "export",
        snapshot.to_str().unwrap(),
        "--format",
        "caffe",
        "-o",
    ])
    .arg(&exported);
    ok(&run(&mut c));
    let back = out_dir(back);
    ok(&import_net(
        net,
        &back,
        &["--weights", exported.to_str().unwrap()],
    ));
    let (a, b) = (
        tensors(snapshot),
        tensors(&back.join("weights.safetensors")),
    );
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (name, (shape, values)) in &a {
        assert_eq!(shape, &b[name].0, "{name}");
        assert_eq!(bits(values), bits(&b[name].1), "{name}");
    }
}

/// Imports the digits net with its 50-iteration solver and Caffe's initial weights into `dir`.
fn import_for_training(dir: &Path) {
    ok(&import(
        dir,
        &[
            "--solver",
            &caffe("digits_lenet_solver_50.prototxt"),
            "--weights",
            &caffe("digits_lenet_init.caffemodel"),
        ],
    ));
}

/// Trains `config` on one rank from the imported weights of `dir` into `dir/run` with the extra
/// arguments `extra`; returns the run's folder.
fn train_imported(config: &Path, dir: &Path, extra: &[&str]) -> PathBuf {
    let (run_dir, weights) = (dir.join("run"), dir.join("weights.safetensors"));
    let mut args = train_args(config, &run_dir, &[]);
    args.extend(["--weights", weights.to_str().unwrap()]);
    args.extend_from_slice(extra);
    ok(&mpi_p2ptrain(1, &args));
    run_dir
}

/// The imported config with its `[data]` read from the IDX digits instead of the LMDBs (the same
/// records in the same order); written next to it as `idx.toml`.
fn on_idx_digits(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(dir.join("cluster.toml")).unwrap();
    let mut doc: toml_edit::DocumentMut = text.parse().unwrap();
    let data = doc["data"].as_table_mut().unwrap();
    assert_eq!(data["format"].as_str(), Some("lmdb"));
    data.remove("train_source").expect("a train source");
    data.remove("test_source").expect("a test source");
    data["format"] = toml_edit::value("idx");
    for (key, file) in [
        ("train_images", "train-images-idx3-ubyte.gz"),
        ("train_labels", "train-labels-idx1-ubyte.gz"),
        ("test_images", "test-images-idx3-ubyte.gz"),
        ("test_labels", "test-labels-idx1-ubyte.gz"),
    ] {
        data[key] = toml_edit::value(repo(&format!("data/digits/{file}")).display().to_string());
    }
    let path = dir.join("idx.toml");
    std::fs::write(&path, doc.to_string()).unwrap();
    path
}

/// Caffe's loss at every iteration of `caffe_train_from_init.log` (`display: 1`), in order.
fn caffe_losses() -> Vec<f64> {
    let log = std::fs::read_to_string(caffe("caffe_train_from_init.log")).unwrap();
    log.lines()
        .filter(|l| l.contains("] Iteration ") && l.contains("), loss = "))
        .map(|l| l.rsplit("loss = ").next().unwrap().trim().parse().unwrap())
        .collect()
}

#[test]
fn the_digits_net_imports_with_its_data_solver_and_weights() {
    let dir = out_dir("caffe_import_digits");
    import_for_training(&dir);
    let doc: toml::Table = std::fs::read_to_string(dir.join("cluster.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let data = doc["data"].as_table().unwrap();
    let source = |key: &str| dir.join(data[key].as_str().unwrap());
    assert_eq!(
        std::fs::canonicalize(source("train_source")).unwrap(),
        std::fs::canonicalize(caffe("digits_train_lmdb")).unwrap()
    );
    assert_eq!(
        std::fs::canonicalize(source("test_source")).unwrap(),
        std::fs::canonicalize(caffe("digits_test_lmdb")).unwrap()
    );
    assert_eq!(data["shuffle"].as_bool(), Some(false));
    assert_eq!(data["batch_size"].as_integer(), Some(50));
    assert_eq!(data["scale"].as_float(), Some(0.00390625));
    let solver = doc["solver"].as_table().unwrap();
    assert_eq!(solver["lr_policy"].as_str(), Some("inv"));
    assert_eq!(solver["max_iter"].as_integer(), Some(50));
    assert_eq!(doc["cluster"]["backend"].as_str(), Some("cpu"));
    let layers = doc["layer"].as_array().unwrap();
    let names: Vec<_> = layers.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2", "accuracy", "loss"]
    );
    let shapes: Vec<(String, Vec<usize>)> = tensors(&dir.join("weights.safetensors"))
        .into_iter()
        .map(|(n, (s, _))| (n, s))
        .collect();
    let want = [
        ("conv1.bias", vec![20]),
        ("conv1.weight", vec![20, 1, 3, 3]),
        ("conv2.bias", vec![50]),
        ("conv2.weight", vec![50, 20, 3, 3]),
        ("ip1.bias", vec![500]),
        ("ip1.weight", vec![500, 200]),
        ("ip2.bias", vec![10]),
        ("ip2.weight", vec![10, 500]),
    ];
    let want: Vec<(String, Vec<usize>)> = want.into_iter().map(|(n, s)| (n.into(), s)).collect();
    assert_eq!(shapes, want);
}

/// Caffe's 50 iterations from its initial weights, redone by p2ptrain from the imported net,
/// solver and weights: every iteration's loss within 1e-4 (relative) of Caffe's log, and the
/// weights after them close to Caffe's 50-iteration caffemodel.
#[test]
fn caffes_losses_are_reproduced_over_50_iterations() {
    let dir = out_dir("caffe_import_train");
    import_for_training(&dir);
    let run_dir = train_imported(&on_idx_digits(&dir), &dir, &[]);
    let ours = train_losses(&run_dir);
    let theirs = caffe_losses();
    assert_eq!(theirs.len(), 50, "Caffe's log holds 50 iterations");
    assert_eq!(ours.len(), theirs.len(), "one displayed loss per iteration");
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * b.abs(),
            "iteration {i}: p2ptrain {a}, Caffe {b}"
        );
    }
    let caffe50 = out_dir("caffe_import_train_50");
    ok(&import(
        &caffe50,
        &[
            "--weights",
            &caffe("digits_lenet_from_init_iter_50.caffemodel"),
        ],
    ));
    let diff = max_rel_diff(
        &run_dir.join("digits_lenet_from_init_iter_50.safetensors"),
        &caffe50.join("weights.safetensors"),
    );
    assert!(diff < 1e-5, "weights after 50 iterations differ by {diff}");
}

/// The NumPy forward pass of Caffe's final weights over every test digit (`numpy_check.txt`):
/// loss, correct, total.
fn numpy_reference() -> (f64, u64, u64) {
    let reference = std::fs::read_to_string(caffe("numpy_check.txt")).unwrap();
    let line = reference
        .lines()
        .find(|l| l.starts_with("digits_lenet_iter_600.caffemodel: all 297 test images"))
        .expect("the reference line of the final weights");
    // "... loss 0.233091 accuracy 0.939394 (279/297)"
    let loss = line
        .split("loss ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let counts = line.rsplit('(').next().unwrap().trim_end_matches(')');
    let (correct, total) = counts.split_once('/').unwrap();
    (
        loss.parse().unwrap(),
        correct.parse().unwrap(),
        total.parse().unwrap(),
    )
}

/// Caffe's final weights, imported and scored by `p2ptrain test` on two ranks over the 297 test
/// digits: the counts and loss of the float64 NumPy forward pass of the same caffemodel.
#[test]
fn the_final_caffemodel_scores_as_caffes_forward_pass() {
    let (loss, correct, total) = numpy_reference();
    let dir = out_dir("caffe_import_score");
    ok(&import(
        &dir,
        &["--weights", &caffe("digits_lenet_iter_600.caffemodel")],
    ));
    let config = on_idx_digits(&dir);
    ok(&mpi_p2ptrain(
        2,
        &[
            "test",
            config.to_str().unwrap(),
            "--weights",
            dir.join("weights.safetensors").to_str().unwrap(),
            "--output",
            dir.join("run").to_str().unwrap(),
        ],
    ));
    let m = metrics(&dir.join("run/metrics.jsonl"));
    assert_eq!(m.len(), 1, "one test line: {m:?}");
    let acc = m[0]["accuracy"].as_f64().unwrap();
    assert_eq!((acc * total as f64).round() as u64, correct, "{m:?}");
    let ours = m[0]["loss"].as_f64().unwrap();
    assert!((ours - loss).abs() < 1e-5, "loss {ours}, NumPy {loss}");
    assert_absent(&dir.join("run/snapshots"), "test writes no snapshot");
}

/// A p2ptrain snapshot exported to `.caffemodel` and imported back is the snapshot bit for bit.
#[test]
fn an_exported_snapshot_imports_back_bitwise() {
    let dir = out_dir("caffe_export_roundtrip");
    import_for_training(&dir);
    let run_dir = train_imported(&on_idx_digits(&dir), &dir, &["--set", "solver.max_iter=3"]);
    let snapshot = run_dir.join("digits_lenet_from_init_iter_3.safetensors");
    let net = caffe("digits_lenet_train_test.prototxt");
    assert_exports_back_bitwise(&snapshot, &net, "caffe_export_roundtrip_back");
}

#[test]
fn what_p2ptrain_lacks_is_an_error_naming_layer_type_and_line() {
    let dir = out_dir("caffe_import_errors");
    let net = std::fs::read_to_string(caffe("digits_lenet_train_test.prototxt")).unwrap();
    // (net text, the layer named, what the message says, the text of the line it names)
    let cases = [
        (
            net.replace("type: \"ReLU\"", "type: \"BNLL\""),
            "layer relu1 (BNLL)",
            "type BNLL is not supported",
            "type: \"BNLL\"",
        ),
        (
            net.replace(
                "type: \"ReLU\"",
                "type: \"LRN\"\n  lrn_param { local_size: 4 }",
            ),
            "layer relu1 (LRN)",
            "`local_size`: must be odd",
            "local_size: 4",
        ),
        (
            net.replacen("pool: MAX", "pool: STOCHASTIC", 1),
            "layer pool1 (Pooling)",
            "`pool`",
            "pool: STOCHASTIC",
        ),
        (
            net.replace("backend: LMDB", "backend: LEVELDB"),
            "layer digits (Data)",
            "backend LEVELDB is not supported",
            "backend: LEVELDB",
        ),
        (
            "name: \"old\"\nlayers {\n  name: \"conv1\"\n  type: CONVOLUTION\n}\n".to_string(),
            "`layers`",
            "upgrade_net_proto_text",
            "layers {",
        ),
    ];
    for (i, (net_text, who, what, marker)) in cases.iter().enumerate() {
        let path = dir.join(format!("net{i}.prototxt"));
        std::fs::write(&path, net_text).unwrap();
        let mut c = std::process::Command::new(bin());
        c.arg("import-caffe")
            .arg(&path)
            .arg("-o")
            .arg(dir.join("out"));
        let out = run(&mut c);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        let line = 1 + net_text.lines().position(|l| l.contains(marker)).unwrap();
        assert!(
            err.contains(&format!("net{i}.prototxt:{line}:")),
            "line {line} in {err}"
        );
        assert!(err.contains(who), "{who} in {err}");
        assert!(err.contains(what), "{what} in {err}");
    }
    assert_absent(
        &dir.join("out/cluster.toml"),
        "nothing is written on an error",
    );
}

/// The digits net with a layer of each of ELU, PReLU, LRN (both regions), ArgMax and
/// EuclideanLoss: their `*_param` blocks become the keys of their `[[layer]]` tables, the net
/// trains (the PReLU slopes learn like any weight), and its snapshot exported to `.caffemodel`
/// imports back bit for bit.
#[test]
fn elu_prelu_lrn_arg_max_and_euclidean_loss_import_train_and_export_back() {
    let dir = out_dir("caffe_import_more_kinds");
    let net = std::fs::read_to_string(caffe("digits_lenet_train_test.prototxt"))
        .unwrap()
        .replace("source: \"digits_", &format!("source: \"{}/digits_", caffe("")))
        .replace(
            "bottom: \"pool1\"\n  top: \"conv2\"",
            "bottom: \"norm1\"\n  top: \"conv2\"",
        )
        .replace(
            "layer {\n  name: \"conv2\"",
            "layer {\n  name: \"norm1\"\n  type: \"LRN\"\n  bottom: \"pool1\"\n  top: \"norm1\"\n  \
             lrn_param { local_size: 3 alpha: 0.0001 beta: 0.75 norm_region: WITHIN_CHANNEL }\n}\n\
             layer {\n  name: \"conv2\"",
        )
        .replace(
            "layer {\n  name: \"pool2\"",
            "layer {\n  name: \"norm2\"\n  type: \"LRN\"\n  bottom: \"conv2\"\n  top: \"conv2\"\n  \
             lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 k: 2 }\n}\n\
             layer {\n  name: \"elu2\"\n  type: \"ELU\"\n  bottom: \"conv2\"\n  top: \"conv2\"\n  \
             elu_param { alpha: 0.5 }\n}\n\
             layer {\n  name: \"pool2\"",
        )
        .replace(
            "type: \"ReLU\"",
            "type: \"PReLU\"\n  prelu_param { filler { type: \"constant\" value: 0.2 } }",
        )
        .replace(
            "layer {\n  name: \"accuracy\"",
            "layer {\n  name: \"ip3\"\n  type: \"InnerProduct\"\n  bottom: \"ip1\"\n  top: \"ip3\"\n  \
             inner_product_param { num_output: 1 weight_filler { type: \"xavier\" } }\n}\n\
             layer {\n  name: \"reg\"\n  type: \"EuclideanLoss\"\n  bottom: \"ip3\"\n  \
             bottom: \"label\"\n  top: \"reg\"\n  loss_weight: 0.01\n}\n\
             layer {\n  name: \"argmax\"\n  type: \"ArgMax\"\n  bottom: \"ip2\"\n  top: \"amax\"\n  \
             include { phase: TEST }\n  argmax_param { top_k: 2 out_max_val: true }\n}\n\
             layer {\n  name: \"accuracy\"",
        );
    let prototxt = dir.join("net.prototxt");
    std::fs::write(&prototxt, &net).unwrap();
    ok(&import_net(prototxt.to_str().unwrap(), &dir, &[]));
    let keys = [
        "type = \"lrn\"",
        "norm_region = \"within_channel\"",
        "k = 2",
        "type = \"elu\"",
        "alpha = 0.5",
        "type = \"prelu\"",
        "filler = { type = \"constant\", value = 0.2 }",
        "type = \"euclidean_loss\"",
        "loss_weight = 0.01",
        "type = \"arg_max\"",
        "out_max_val = true",
    ];
    assert_file_contains(&dir.join("cluster.toml"), &keys);

    let run_dir = dir.join("run");
    let idx = on_idx_digits(&dir);
    ok(&mpi_p2ptrain(
        1,
        &train_args(&idx, &run_dir, &["solver.max_iter=2"]),
    ));
    let lines = metrics(&run_dir.join("metrics.jsonl"));
    let tested = lines.iter().filter(|l| l["phase"] == "test");
    for l in tested {
        assert!(l.get("accuracy").is_some(), "{l}");
        assert!(l.get("amax").is_none(), "ArgMax's top is no metric: {l}");
    }
    let snapshot = run_dir.join("snapshots/model_iter_2.safetensors");
    let slope = &tensors(&snapshot)["relu1.slope"];
    assert_eq!(slope.0, vec![500]);
    assert!(slope.1.iter().any(|&a| a != 0.2), "the slopes learn");

    let net = prototxt.to_str().unwrap();
    assert_exports_back_bitwise(&snapshot, net, "caffe_import_more_kinds_back");
}

/// Caffe's 50 iterations read from Caffe's own LMDB (shuffle off): needs p2ptrain's LMDB reader.
#[test]
fn caffes_losses_are_reproduced_from_its_lmdb() {
    let dir = out_dir("caffe_import_lmdb");
    import_for_training(&dir);
    let run_dir = train_imported(&dir.join("cluster.toml"), &dir, &[]);
    let ours = train_losses(&run_dir);
    let theirs = caffe_losses();
    assert_eq!(ours.len(), theirs.len());
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * b.abs(),
            "iteration {i}: p2ptrain {a}, Caffe {b}"
        );
    }
}

/// The final caffemodel scored over Caffe's own test LMDB: needs p2ptrain's LMDB reader.
#[test]
fn the_final_caffemodel_scores_as_caffes_forward_pass_on_its_lmdb() {
    let dir = out_dir("caffe_import_score_lmdb");
    ok(&import(
        &dir,
        &["--weights", &caffe("digits_lenet_iter_600.caffemodel")],
    ));
    ok(&mpi_p2ptrain(
        2,
        &[
            "test",
            dir.join("cluster.toml").to_str().unwrap(),
            "--weights",
            dir.join("weights.safetensors").to_str().unwrap(),
            "--output",
            dir.join("run").to_str().unwrap(),
        ],
    ));
    let (_, correct, total) = numpy_reference();
    let m = metrics(&dir.join("run/metrics.jsonl"));
    let acc = m[0]["accuracy"].as_f64().unwrap();
    assert_eq!((acc * total as f64).round() as u64, correct, "{m:?}");
}
