//! Caffe's LMDBs (`convert_imageset`, `convert_mnist_data`): a folder with `data.mdb`, one
//! [`Datum`](super::datum) per record, read in stored key order through heed (LMDB 0.9's file
//! format, the C library vendored by the crate).
//!
//! The environment is opened read-only and without LMDB's lock file (`MDB_RDONLY |
//! MDB_NOLOCK`): nothing is written into the dataset's folder (a read-only or shared folder
//! works), and every rank of a node maps the same pages. The dataset must not be written while it
//! is read. Opening walks the keys and reads each record's label (the end of its value, one page
//! per record); each read later starts a read transaction of its own (cheap without the lock
//! table) and borrows the value from the memory map.

use super::datum::DatumView;
use heed::types::Bytes;
use heed::{Database, EnvFlags, EnvOpenOptions, WithoutTls};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The keys and labels of an LMDB, and the open environment to read records from.
pub struct LmdbStore {
    path: PathBuf,
    env: heed::Env<WithoutTls>,
    db: Database<Bytes, Bytes>,
    keys: Vec<Box<[u8]>>,
    labels: Vec<i64>,
}

impl std::fmt::Debug for LmdbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LmdbStore({}, {} records)",
            self.path.display(),
            self.keys.len()
        )
    }
}

/// Opens the environment at `path` read-only without a lock file.
fn open_env(path: &Path) -> Result<heed::Env<WithoutTls>, String> {
    if !path.is_dir() {
        return Err(if path.exists() {
            "not an LMDB: a file, not a folder holding data.mdb".into()
        } else {
            "no such LMDB folder".into()
        });
    }
    if !path.join("data.mdb").is_file() {
        return Err("not an LMDB: the folder holds no data.mdb".into());
    }
    // LMDB allows one open environment per file and process (heed refuses a second), and one
    // process may read a dataset several times at once (its replicas, train and test on the same
    // LMDB): each folder is opened once and shared for the life of the process.
    static OPEN: Mutex<Vec<(PathBuf, heed::Env<WithoutTls>)>> = Mutex::new(Vec::new());
    let key = path
        .canonicalize()
        .map_err(|e| format!("cannot resolve the path: {e}"))?;
    let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, env)) = open.iter().find(|(p, _)| *p == key) {
        return Ok(env.clone());
    }
    let mut options = EnvOpenOptions::new().read_txn_without_tls();
    // SAFETY: the map is only read, and the dataset must not be written while training reads it
    // (the module's contract); without the lock file no other process is told about this reader.
    let env = unsafe {
        options.flags(EnvFlags::READ_ONLY | EnvFlags::NO_LOCK | EnvFlags::NO_READ_AHEAD);
        options.open(&key)
    }
    .map_err(|e| format!("not a readable LMDB: {e}"))?;
    open.push((key, env.clone()));
    Ok(env)
}

/// A read transaction of `env` and its main (unnamed) database.
fn main_db(
    env: &heed::Env<WithoutTls>,
) -> Result<(heed::RoTxn<'_, WithoutTls>, Database<Bytes, Bytes>), String> {
    let txn = env
        .read_txn()
        .map_err(|e| format!("cannot read the LMDB: {e}"))?;
    let db = env
        .open_database(&txn, None)
        .map_err(|e| format!("cannot open the LMDB's database: {e}"))?
        .ok_or("the LMDB has no main database")?;
    Ok((txn, db))
}

impl LmdbStore {
    /// Opens the LMDB folder `path` and reads every record's key and label.
    pub fn open(path: &Path) -> Result<Self, String> {
        let env = open_env(path)?;
        let (txn, db) = main_db(&env)?;
        let mut keys = Vec::new();
        let mut labels = Vec::new();
        let iter = db
            .iter(&txn)
            .map_err(|e| format!("cannot walk the LMDB: {e}"))?;
        for entry in iter {
            let (key, value) = entry.map_err(|e| format!("cannot walk the LMDB: {e}"))?;
            let label = DatumView::label_of(value).map_err(|e| {
                format!(
                    "record {} (key `{}`): not a Caffe Datum: {e}",
                    keys.len(),
                    String::from_utf8_lossy(key)
                )
            })?;
            keys.push(key.into());
            labels.push(label);
        }
        drop(txn);
        Ok(LmdbStore {
            path: path.to_path_buf(),
            env,
            db,
            keys,
            labels,
        })
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the database holds no records.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Each record's label, in key order.
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }

    /// Record `index`'s key, for messages.
    pub fn key(&self, index: usize) -> String {
        String::from_utf8_lossy(&self.keys[index]).into_owned()
    }

    /// Calls `f` with record `index`'s value, borrowed from the map for the call.
    pub fn with_value<R>(
        &self,
        index: usize,
        f: impl FnOnce(&[u8]) -> Result<R, String>,
    ) -> Result<R, String> {
        let txn = self
            .env
            .read_txn()
            .map_err(|e| format!("cannot read the LMDB: {e}"))?;
        let value = self
            .db
            .get(&txn, &self.keys[index])
            .map_err(|e| format!("cannot read the record: {e}"))?
            .ok_or("the record has gone from the LMDB (written while read?)")?;
        f(value)
    }
}

/// The first record's value of the LMDB folder `path` (what validation reads to learn the
/// records' shape).
pub fn first_value(path: &Path) -> Result<Vec<u8>, String> {
    let env = open_env(path)?;
    let (txn, db) = main_db(&env)?;
    let first = db
        .first(&txn)
        .map_err(|e| format!("cannot read the LMDB: {e}"))?
        .ok_or("the LMDB holds no records")?;
    Ok(first.1.to_vec())
}

/// Writes `records` (key, serialized value) into a new LMDB folder `path` (created; it must not
/// exist), committing every 1000 records as Caffe's `convert_imageset` does.
pub fn write(
    path: &Path,
    records: impl Iterator<Item = (String, Vec<u8>)>,
) -> Result<usize, String> {
    if path.exists() {
        return Err("already exists: convert-imageset writes a new LMDB folder".into());
    }
    std::fs::create_dir_all(path).map_err(|e| format!("cannot create the folder: {e}"))?;
    let mut options = EnvOpenOptions::new();
    options.map_size(1 << 40); // Caffe's LMDB_MAP_SIZE; the file grows as written
                               // SAFETY: a new environment that only this function uses.
    let env = unsafe { options.open(path) }.map_err(|e| format!("cannot create the LMDB: {e}"))?;
    let fail = |e: heed::Error| format!("cannot write the LMDB: {e}");
    let mut txn = env.write_txn().map_err(fail)?;
    let db: Database<Bytes, Bytes> = env.create_database(&mut txn, None).map_err(fail)?;
    let mut count = 0;
    for (key, value) in records {
        db.put(&mut txn, key.as_bytes(), &value).map_err(fail)?;
        count += 1;
        if count % 1000 == 0 {
            txn.commit().map_err(fail)?;
            txn = env.write_txn().map_err(fail)?;
        }
    }
    txn.commit().map_err(fail)?;
    env.force_sync().map_err(fail)?;
    drop(env);
    // LMDB creates its files 0600; a dataset is for every user to read, as Caffe's (0664).
    for file in ["data.mdb", "lock.mdb"] {
        use std::os::unix::fs::PermissionsExt;
        let perms = std::fs::Permissions::from_mode(0o644);
        std::fs::set_permissions(path.join(file), perms)
            .map_err(|e| format!("cannot make {file} readable: {e}"))?;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::datum::Datum;
    use prost::Message;

    #[test]
    fn written_records_read_back_in_key_order_and_no_lock_file_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        let value = |label| {
            Datum {
                label: Some(label),
                data: Some(vec![label as u8; 3]),
                ..Datum::default()
            }
            .encode_to_vec()
        };
        let recs = (0..2500).map(|i| (format!("{i:08}_x"), value(i % 7)));
        assert_eq!(write(&db, recs), Ok(2500));
        std::fs::remove_file(db.join("lock.mdb")).unwrap();
        let store = LmdbStore::open(&db).unwrap();
        assert_eq!(store.len(), 2500);
        assert_eq!(store.key(1234), "00001234_x");
        assert_eq!(store.labels()[1234], 1234 % 7);
        let data = store
            .with_value(8, |v| Ok(DatumView::parse(v)?.data.to_vec()))
            .unwrap();
        assert_eq!(data, vec![1; 3]);
        assert!(!db.join("lock.mdb").exists(), "opened without a lock file");
        assert!(write(&db, std::iter::empty())
            .unwrap_err()
            .contains("exists"));
    }

    /// Two stores of one folder at once (a process reads a dataset through several stores: its
    /// replicas, train and test on the same LMDB), the second through another spelling of the
    /// path: both open and read.
    #[test]
    fn one_folder_opens_twice_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        let recs = (0..3).map(|i| (format!("{i}"), Datum::default().encode_to_vec()));
        assert_eq!(write(&db, recs), Ok(3));
        let first = LmdbStore::open(&db).unwrap();
        let second = LmdbStore::open(&dir.path().join("./db/")).unwrap();
        assert_eq!((first.len(), second.len()), (3, 3));
        assert_eq!(second.key(2), "2");
    }

    #[test]
    fn a_folder_that_is_not_an_lmdb_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let e = LmdbStore::open(dir.path()).unwrap_err();
        assert!(e.contains("no data.mdb"), "{e}");
        std::fs::write(dir.path().join("data.mdb"), vec![7u8; 9000]).unwrap();
        let e = LmdbStore::open(dir.path()).unwrap_err();
        assert!(e.contains("not a readable LMDB"), "{e}");
        let e = LmdbStore::open(&dir.path().join("nothing")).unwrap_err();
        assert!(e.contains("no such"), "{e}");
    }
}
