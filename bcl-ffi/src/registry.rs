//! Communicator handles. A `bclComm_t` is an opaque number, never a pointer BCL dereferences:
//! a destroyed or made-up handle is found missing here and reported, not followed.

use bcl_core::{Communicator, Error};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(1);
static LIVE: Mutex<Option<HashMap<usize, Arc<Communicator>>>> = Mutex::new(None);

pub(crate) fn insert(comm: Communicator) -> usize {
    // Handles step by 16 so that they look like aligned pointers to C code and tools.
    let id = NEXT.fetch_add(1, Ordering::Relaxed) * 16;
    LIVE.lock()
        .get_or_insert_with(HashMap::new)
        .insert(id, Arc::new(comm));
    id
}

pub(crate) fn get(id: usize) -> Result<Arc<Communicator>, Error> {
    if id == 0 {
        return Err(Error::InvalidArgument("comm is NULL".into()));
    }
    LIVE.lock()
        .as_ref()
        .and_then(|m| m.get(&id).cloned())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "comm {id:#x} is not a live communicator (destroyed, aborted, or never created)"
            ))
        })
}

pub(crate) fn remove(id: usize) -> Result<Arc<Communicator>, Error> {
    let comm = get(id)?;
    LIVE.lock().as_mut().and_then(|m| m.remove(&id));
    Ok(comm)
}
