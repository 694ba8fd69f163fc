//! A store in a shared directory: one file per key, written atomically (temp file + rename).

use super::{Store, StoreError};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A store whose keys are files under `dir` (a local or shared file system).
#[derive(Clone, Debug)]
pub struct FileStore {
    dir: PathBuf,
}

impl FileStore {
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|source| StoreError::Io {
            store: format!("file ({})", dir.display()),
            what: "creating the directory".into(),
            source,
        })?;
        Ok(FileStore { dir })
    }

    fn path(&self, key: &str) -> PathBuf {
        let safe: String = key
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.dir.join(format!("{safe}.key"))
    }

    fn io(&self, what: String, source: std::io::Error) -> StoreError {
        StoreError::Io {
            store: format!("file ({})", self.dir.display()),
            what,
            source,
        }
    }
}

impl Store for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let path = self.path(key);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        // Readable by this user alone: one of the keys is the communicator's secret.
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(value)
        };
        write().map_err(|e| self.io(format!("writing '{key}'"), e))?;
        std::fs::rename(&tmp, &path).map_err(|e| self.io(format!("publishing '{key}'"), e))
    }

    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>, StoreError> {
        loop {
            if let Some(v) = self.try_get(key)? {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Timeout {
                    store: format!("file ({})", self.dir.display()),
                    key: key.to_string(),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match std::fs::read(self.path(key)) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io(format!("reading '{key}'"), e)),
        }
    }
}
