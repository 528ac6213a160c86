//! Generates the C header from src/lib.rs with cbindgen (configuration: cbindgen.toml).
//!
//! The header is written to `$OUT_DIR/zmem.h` and, when its content changed, to
//! `include/zmem.h` at the workspace root (checked in, so C users need no Rust toolchain to
//! read it). `tests/header.rs` fails when the checked-in copy differs from the generated one,
//! which catches a source tree that could not be written and, with `ZMEM_CAPI_HEADER=check`
//! (build.rs then leaves include/ alone; meant for CI), a stale header that was committed.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

fn main() {
    let crate_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=src/lib.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=ZMEM_CAPI_HEADER");
    // A hand-edited or checked-out header is regenerated too (after writing it, the next build
    // reruns this script once more, finds it equal and leaves it alone).
    println!("cargo:rerun-if-changed=../../include/zmem.h");

    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("crates/capi/cbindgen.toml is not a valid cbindgen configuration");
    // with_src parses src/lib.rs alone: no `cargo metadata` run, no dependency parsing (the
    // header only names types defined in this file).
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen could not generate zmem.h from crates/capi/src/lib.rs");
    let mut header = Vec::new();
    bindings.write(&mut header);

    let generated = out_dir.join("zmem.h");
    write_if_changed(&generated, &header).expect("cannot write $OUT_DIR/zmem.h");

    if env::var("ZMEM_CAPI_HEADER").as_deref() == Ok("check") {
        return;
    }
    let checked_in = crate_dir.join("../../include/zmem.h");
    if let Err(e) = write_if_changed(&checked_in, &header) {
        println!(
            "cargo:warning=cannot update {}: {e} (tests/header.rs will report it stale)",
            checked_in.display()
        );
    }
}

/// Writes `content` to `path` unless it already holds exactly that, through a temporary file
/// and a rename so a concurrent reader (another build, the C test) never sees half a header.
fn write_if_changed(path: &Path, content: &[u8]) -> std::io::Result<()> {
    if fs::read(path).is_ok_and(|old| old == content) {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("h.tmp{}", std::process::id()));
    fs::write(&tmp, content)?;
    fs::rename(&tmp, path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}
