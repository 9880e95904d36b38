//! The image files of the two file layouts: Caffe's `ImageData` list files (`format =
//! "image_list"`: one `relative/path label` per line, the label after the last space, paths
//! under `root_folder`), and torchvision's `ImageFolder` trees (`format = "image_folder"`: one
//! folder per class, classes numbered in sorted name order, every `.jpg`, `.jpeg` or `.png`
//! below a class folder in sorted path order).
//!
//! Every file is checked to exist when the list is read, so a missing file is named before
//! training starts.

use std::path::{Path, PathBuf};

/// The file extensions read (case-insensitive).
pub const IMAGE_EXTENSIONS: [&str; 3] = ["jpg", "jpeg", "png"];

/// Image files and their labels.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileList {
    pub files: Vec<PathBuf>,
    pub labels: Vec<i64>,
}

/// Reads the list file `list` (its lines `path label`) with paths under `root`; `Err` names the
/// line or the missing file.
pub fn read_list(list: &Path, root: &Path) -> Result<FileList, String> {
    let text = std::fs::read_to_string(list).map_err(|e| format!("cannot read: {e}"))?;
    let mut out = FileList::default();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let Some((path, label)) = line.rsplit_once(' ') else {
            return Err(format!(
                "line {}: expected `relative/path label`, found `{line}`",
                n + 1
            ));
        };
        let label: i64 = label
            .trim()
            .parse()
            .map_err(|_| format!("line {}: the label `{label}` is not an integer", n + 1))?;
        let file = root.join(path);
        if !file.is_file() {
            return Err(format!(
                "line {}: no such image file: {}",
                n + 1,
                file.display()
            ));
        }
        out.files.push(file);
        out.labels.push(label);
    }
    Ok(out)
}

/// The class folders of `root`, sorted by name.
pub fn class_names(root: &Path) -> Result<Vec<String>, String> {
    let entries = std::fs::read_dir(root).map_err(|e| format!("cannot list the folder: {e}"))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list the folder: {e}"))?;
        if entry.path().is_dir() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    if names.is_empty() {
        return Err(
            "holds no class folders (one folder per class, as torchvision's ImageFolder)".into(),
        );
    }
    Ok(names)
}

/// The images of the tree `root` labelled by `classes` (the training tree's class folders,
/// sorted): every class folder of `root` must be one of them.
pub fn read_folder(root: &Path, classes: &[String]) -> Result<FileList, String> {
    let mut out = FileList::default();
    for name in class_names(root)? {
        let Ok(label) = classes.binary_search(&name) else {
            return Err(format!(
                "class folder `{name}` is not among the training set's {} classes",
                classes.len()
            ));
        };
        let mut files = Vec::new();
        walk(&root.join(&name), &mut files)?;
        files.sort();
        out.labels
            .extend(std::iter::repeat_n(label as i64, files.len()));
        out.files.extend(files);
    }
    Ok(out)
}

/// Every image file below `dir`, recursively, following links.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry
            .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
            .path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if is_image(&path) {
            out.push(path);
        }
    }
    Ok(())
}

fn is_image(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

/// The first image of a tree (the first file of its first class), without listing the rest.
pub fn first_in_folder(root: &Path) -> Result<PathBuf, String> {
    for name in class_names(root)? {
        let mut files = Vec::new();
        walk(&root.join(&name), &mut files)?;
        if let Some(first) = files.into_iter().min() {
            return Ok(first);
        }
    }
    Err("holds no .jpg, .jpeg or .png images".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_takes_the_label_after_the_last_space() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a b")).unwrap();
        std::fs::write(dir.path().join("a b/x.png"), b"").unwrap();
        std::fs::write(dir.path().join("y.jpg"), b"").unwrap();
        let list = dir.path().join("list.txt");
        std::fs::write(&list, "a b/x.png 3\r\n\ny.jpg 0\n").unwrap();
        let got = read_list(&list, dir.path()).unwrap();
        assert_eq!(got.labels, vec![3, 0]);
        assert_eq!(got.files[0], dir.path().join("a b/x.png"));
        std::fs::write(&list, "y.jpg 0\nmissing.png 1\n").unwrap();
        let e = read_list(&list, dir.path()).unwrap_err();
        assert!(e.contains("line 2") && e.contains("missing.png"), "{e}");
        std::fs::write(&list, "y.jpg zero\n").unwrap();
        assert!(read_list(&list, dir.path())
            .unwrap_err()
            .contains("not an integer"));
        std::fs::write(&list, "y.jpg\n").unwrap();
        assert!(read_list(&list, dir.path()).unwrap_err().contains("line 1"));
    }

    #[test]
    fn a_folder_numbers_classes_in_sorted_order_and_walks_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let touch = |p: &str| {
            let p = dir.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"").unwrap();
        };
        touch("train/dog/b.JPG");
        touch("train/dog/sub/a.png");
        touch("train/cat/z.jpeg");
        touch("train/cat/notes.txt");
        touch("val/dog/q.jpg");
        let classes = class_names(&dir.path().join("train")).unwrap();
        assert_eq!(classes, vec!["cat", "dog"]);
        let got = read_folder(&dir.path().join("train"), &classes).unwrap();
        let names: Vec<_> = got
            .files
            .iter()
            .map(|p| {
                p.strip_prefix(dir.path())
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(
            names,
            vec!["train/cat/z.jpeg", "train/dog/b.JPG", "train/dog/sub/a.png"]
        );
        assert_eq!(got.labels, vec![0, 1, 1]);
        let val = read_folder(&dir.path().join("val"), &classes).unwrap();
        assert_eq!(val.labels, vec![1]);
        touch("val/bird/q.jpg");
        let e = read_folder(&dir.path().join("val"), &classes).unwrap_err();
        assert!(e.contains("`bird`"), "{e}");
        assert_eq!(
            first_in_folder(&dir.path().join("train")).unwrap(),
            dir.path().join("train/cat/z.jpeg")
        );
    }
}
