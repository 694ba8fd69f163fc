//! The one guard every exported function goes through: panics are caught, errors become a
//! result code and a thread-local last-error text that names the cause.

use crate::types::{BCL_INTERNAL_ERROR, BCL_SUCCESS, BclResult, code_of};
use bcl_core::Error;
use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{AssertUnwindSafe, catch_unwind};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn remember(text: String) {
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// Run `f` for the function `name`; map its outcome to a code.
pub(crate) fn call(name: &str, f: impl FnOnce() -> Result<(), Error>) -> BclResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => BCL_SUCCESS,
        Ok(Err(e)) => {
            remember(format!("{name}: {e}"));
            code_of(&e)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            remember(format!("{name}: internal error (caught panic: {what})"));
            BCL_INTERNAL_ERROR
        }
    }
}

/// As [`call`], for the functions that report a status (`bclStreamQuery`, ...): `f` returns
/// the code and, where it is an error, its text for `bclGetLastError`.
pub(crate) fn call_status(
    name: &str,
    f: impl FnOnce() -> Result<(BclResult, Option<String>), Error>,
) -> BclResult {
    let mut status = BCL_SUCCESS;
    let code = call(name, || {
        let (code, text) = f()?;
        if let Some(text) = text {
            remember(format!("{name}: {text}"));
        }
        status = code;
        Ok(())
    });
    if code == BCL_SUCCESS { status } else { code }
}

/// A pointer to this thread's last error text (valid until the next failing call here).
pub(crate) fn last_error() -> *const std::ffi::c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}
