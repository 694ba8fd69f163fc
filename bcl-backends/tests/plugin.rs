//! Device plugins that are broken, each in one way: BCL refuses them with an error that names
//! the plugin file and the entry at fault, and never crashes.

mod support;

use bcl_backends::{Accelerator, DeviceError, DeviceOptions, DeviceSpec, open_device};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn open(path: &Path, index: u32) -> Result<Arc<dyn Accelerator>, DeviceError> {
    let options = DeviceOptions {
        plugin: Some(path.to_path_buf()),
    };
    open_device(&DeviceSpec::Plugin(index), 0, &options)
}

/// Opening device 0 of the plugin built with `define` fails, naming the file and `words`.
fn refused(define: &str, words: &[&str]) {
    let path = support::sample_plugin(&[define]);
    let e = open(&path, 0).expect_err(define);
    let text = e.to_string();
    assert!(matches!(e, DeviceError::Unavailable(_)), "{define}: {text}");
    assert!(
        text.contains(&path.display().to_string()),
        "{define}: {text}"
    );
    for w in words {
        assert!(text.contains(w), "{define}: `{w}` missing from: {text}");
    }
}

#[test]
fn a_missing_symbol_is_named() {
    refused(
        "-DARENA_BROKEN_SYMBOL",
        &[
            "bclDevicePlugin_v0",
            "not bclDevicePlugin_v1",
            "another version",
        ],
    );
}

#[test]
fn a_table_of_another_version_is_refused() {
    refused("-DARENA_BROKEN_VERSION", &["version 99", "reads version 1"]);
}

#[test]
fn a_null_entry_is_named() {
    refused(
        "-DARENA_BROKEN_NULL_ENTRY",
        &["(arena)", "entry divide is NULL"],
    );
}

#[test]
fn a_failing_init_is_named_with_the_plugins_words() {
    refused(
        "-DARENA_BROKEN_INIT",
        &[
            "entry init failed",
            "internal error",
            "no arena driver on this host",
        ],
    );
}

#[test]
fn a_plugin_without_devices_is_refused() {
    refused(
        "-DARENA_BROKEN_ZERO_DEVICES",
        &["entry devices reports 0 devices"],
    );
}

#[test]
fn an_entry_that_fails_later_names_itself_and_the_file() {
    let path = support::sample_plugin(&["-DARENA_BROKEN_ALLOC"]);
    let dev = open(&path, 1).expect("the plugin loads; only its allocations fail");
    let e = dev.allocate(4096).expect_err("every allocation fails");
    let text = e.to_string();
    assert!(
        matches!(e, DeviceError::OutOfMemory { bytes: 4096, .. }),
        "{text}"
    );
    let file = path.display().to_string();
    for w in [file.as_str(), "memAlloc", "arena is exhausted", "arena:1"] {
        assert!(text.contains(w), "`{w}` missing from: {text}");
    }
    // The device stays usable for what does not allocate.
    let stream = dev.create_stream().expect("a stream");
    dev.synchronize(&stream).expect("synchronize");
}

#[test]
fn files_that_are_no_plugin_are_refused() {
    let source =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/device-plugin/arena_plugin.c");
    let missing = PathBuf::from("/nonexistent/libvendor.so");
    for path in [source.as_path(), missing.as_path()] {
        let e = open(path, 0).expect_err("not a library");
        let text = e.to_string();
        assert!(
            text.contains(&path.display().to_string()) && text.contains("cannot be loaded"),
            "{text}"
        );
    }
}

#[test]
fn a_device_the_plugin_does_not_have_is_refused() {
    let path = support::sample_plugin(&[]);
    let e = open(&path, 5).expect_err("the sample has 2 devices");
    let text = e.to_string();
    assert!(
        text.contains("plugin:5") && text.contains("has 2 devices"),
        "{text}"
    );
    assert!(text.contains(&path.display().to_string()), "{text}");
}

#[test]
fn the_working_plugin_describes_its_devices() {
    let path = support::sample_plugin(&[]);
    let (a, b) = (
        open(&path, 0).expect("plugin:0"),
        open(&path, 1).expect("plugin:1"),
    );
    assert_eq!(a.info().to_string(), "arena:0");
    assert_eq!(b.info().model, "arena device 1 (sample plugin)");
    assert!(!a.info().capabilities.host_addressable);
    // Handles of one plugin device are foreign to the other.
    let buf = a.allocate(8).expect("allocate");
    let e = b
        .copy_to_device(buf.full(), &[0; 8], &b.default_stream())
        .expect_err("a buffer of plugin:0 on plugin:1");
    assert!(
        matches!(e, DeviceError::ForeignHandle { what: "buffer", .. }),
        "{e}"
    );
}
