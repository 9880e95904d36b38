//! TODO stub
use super::Config;
use crate::error::Result;
use std::path::{Path, PathBuf};
/// A config text and where it came from.
#[derive(Debug, Clone)]
pub struct Source { pub path: PathBuf, pub text: String }
pub fn load(_path: &Path, _sets: &[String]) -> Result<(Config, Source)> { todo!() }
pub fn load_str(_name: &str, _text: &str, _base_dir: &Path, _sets: &[String]) -> Result<(Config, Source)> { todo!() }
