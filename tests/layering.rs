//! The dependency direction that `src/lib.rs` states holds in the code: no module of the crate
//! names one above it (`crate::<module>`) outside of comments and test code.

use std::path::Path;

/// The top-level modules from the bottom up; modules in one inner list are on the same level.
const ORDER: &[&[&str]] = &[
    &["error", "tensor", "backend", "spans", "input_file"],
    &["config"],
    &["params", "precision"],
    &["layers"],
    &["net"],
    &["solver"],
    &["signals"],
    &["snapshot"],
    &["resume"],
    &["data"],
    &["validate"],
    &["predict"],
    &["caffe"],
    &["inputs"],
    &["dist"],
    &["metrics", "logging", "output_folder"],
    &["cuda"],
    &["parallel"],
    &["chrome_trace"],
    &["cmd"],
];

/// Files that hold test code only.
const TEST_FILES: &[&str] = &[
    "tests.rs",
    "test_util.rs",
    "testing.rs",
    "gradient_check.rs",
];

fn level(module: &str) -> Option<usize> {
    ORDER.iter().position(|l| l.contains(&module))
}

/// The code of a source file without comments and without its trailing `#[cfg(test)]` module.
fn production_code(text: &str) -> String {
    let end = text.find("#[cfg(test)]\nmod ").unwrap_or(text.len());
    text[..end]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The crate modules a piece of code names as `crate::<module>`.
fn named_modules(code: &str) -> Vec<String> {
    code.match_indices("crate::")
        .map(|(i, m)| {
            code[i + m.len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect()
        })
        .collect()
}

fn source_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_module_imports_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &mut files);
    let mut upward = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel
            .iter()
            .next()
            .unwrap()
            .to_str()
            .unwrap()
            .trim_end_matches(".rs");
        let name = file.file_name().unwrap().to_str().unwrap();
        if matches!(top, "lib" | "main") || TEST_FILES.contains(&name) {
            continue;
        }
        let own = level(top).unwrap_or_else(|| panic!("{top} is missing from ORDER"));
        let code = production_code(&std::fs::read_to_string(file).unwrap());
        for module in named_modules(&code) {
            if level(&module).is_some_and(|l| l > own) {
                upward.push(format!("{} names crate::{module}", rel.display()));
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "imports against the order:\n{}",
        upward.join("\n")
    );
}

#[test]
fn an_upward_import_is_found() {
    let code = production_code("use crate::cmd::train;\n// crate::parallel in a comment\n");
    assert_eq!(named_modules(&code), ["cmd"]);
    let with_tests = "fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::cmd;\n}\n";
    assert!(named_modules(&production_code(with_tests)).is_empty());
}

#[test]
fn every_module_of_the_crate_has_a_level() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"));
    for line in lib.unwrap().lines() {
        if let Some(module) = line.strip_prefix("pub mod ") {
            let module = module.trim_end_matches(';');
            assert!(level(module).is_some(), "{module} is missing from ORDER");
        }
    }
}
