//! The sample device plugin (`examples/device-plugin/arena_plugin.c`), built by the tests with
//! the system's C compiler, as a vendor builds theirs against `include/bcl_device_plugin.h`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The variants built by this test process.
static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);

/// The plugin built with `defines` (its `ARENA_BROKEN_*` variants), once per variant and
/// process. `BCL_SAMPLE_PLUGIN` names a prebuilt working one instead (the GPU machines, which
/// run binaries built elsewhere: `scripts/device-prebuild.sh`).
pub fn sample_plugin(defines: &[&str]) -> PathBuf {
    if let (true, Some(prebuilt)) = (defines.is_empty(), std::env::var_os("BCL_SAMPLE_PLUGIN")) {
        return PathBuf::from(prebuilt);
    }
    let variant = defines.concat().replace(['-', '='], "_");
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    if let Some(path) = built.get(&variant) {
        return path.clone();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("libarena{variant}.so"));
    let source = root.join("examples/device-plugin/arena_plugin.c");
    // Built to a private name, then renamed: other test processes never load a half-written
    // file.
    let partial = out.with_extension(format!("{}.partial", std::process::id()));
    let status = Command::new("cc")
        .args([
            "-std=gnu11",
            "-O2",
            "-fPIC",
            "-shared",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        .arg("-I")
        .arg(root.join("include"))
        .args(defines)
        .arg(&source)
        .arg("-o")
        .arg(&partial)
        .arg("-lm")
        .status()
        .expect(
            "a C compiler (cc) is needed to build the sample plugin: scripts/test.sh installs it",
        );
    assert!(status.success(), "building {} failed", source.display());
    std::fs::rename(&partial, &out).expect("rename the built plugin");
    built.insert(variant, out.clone());
    out
}
