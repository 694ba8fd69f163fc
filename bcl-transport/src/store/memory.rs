//! An in-memory store, for ranks that are threads of one process.

use super::{Store, StoreError};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

#[derive(Default)]
struct Inner {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

/// A store in this process's memory; clones share it.
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemoryStore({} keys)", self.inner.map.lock().len())
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Store for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner
            .map
            .lock()
            .insert(key.to_string(), value.to_vec());
        self.inner.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>, StoreError> {
        let mut map = self.inner.map.lock();
        loop {
            if let Some(v) = map.get(key) {
                return Ok(v.clone());
            }
            if self
                .inner
                .changed
                .wait_until(&mut map, deadline)
                .timed_out()
            {
                return map.get(key).cloned().ok_or_else(|| StoreError::Timeout {
                    store: "memory".into(),
                    key: key.to_string(),
                });
            }
        }
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.inner.map.lock().get(key).cloned())
    }
}
