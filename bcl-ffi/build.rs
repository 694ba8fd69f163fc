//! libbcl.so gets the soname "libbcl.so", so a program (or Python's bcl._C) linked against it
//! resolves to a copy already loaded from any path (BCL_LIBRARY) instead of searching again.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libbcl.so");
}
