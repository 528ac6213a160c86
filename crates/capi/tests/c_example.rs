//! Compiles C programs against the libzmem that this `cargo test` built and runs them:
//! examples/c/region.c (a real region; skipped with a reason when this user may not use
//! userfaultfd) and tests/c/errors.c (the error paths; always runs). Both are linked statically
//! (libzmem.a) and dynamically (libzmem.so), with `-Werror -pedantic` against include/zmem.h.
//!
//! Where the libraries come from: the lib target has crate-type cdylib + staticlib + rlib, and
//! cargo builds all three in one rustc run whenever it builds the lib for the integration tests,
//! into target/<profile>/deps/ without a hash in the name (next to this test's executable), so
//! they are always the ones built from the current source. `CC` overrides the C compiler.

use std::env;
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::SystemTime;

/// System libraries a Rust static library needs on Linux
/// (`cargo rustc -p zmem-capi --lib --crate-type staticlib -- --print native-static-libs`).
const STATIC_LIBS: &[&str] = &[
    "-lgcc_s",
    "-lutil",
    "-lrt",
    "-lpthread",
    "-lm",
    "-ldl",
    "-lc",
];

#[derive(Clone, Copy, Debug)]
enum Link {
    Static,
    Shared,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

fn modified(path: &Path) -> SystemTime {
    fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The directory holding the libzmem.a and libzmem.so of this build.
fn lib_dir() -> PathBuf {
    let exe = env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test executable has a directory");
    let candidates = [
        deps.to_path_buf(),
        deps.parent().unwrap_or(deps).to_path_buf(),
    ];
    let dir = candidates
        .iter()
        .find(|d| d.join("libzmem.a").is_file() && d.join("libzmem.so").is_file())
        .unwrap_or_else(|| {
            panic!(
                "libzmem.a / libzmem.so not found in {candidates:?}: cargo should build them \
                 with the lib (crate-type cdylib, staticlib) before this test runs"
            )
        })
        .clone();
    // They must be built from the current source, not left over from an older build.
    let source = modified(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"));
    for lib in ["libzmem.a", "libzmem.so"] {
        assert!(
            modified(&dir.join(lib)) >= source,
            "{} is older than src/lib.rs",
            dir.join(lib).display()
        );
    }
    dir
}

fn show(output: &Output) -> String {
    format!(
        "status: {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Compiles and links `source` against libzmem; returns the executable.
fn build_c(source: &Path, link: Link) -> PathBuf {
    let root = workspace_root();
    let lib_dir = lib_dir();
    let name = source.file_stem().unwrap().to_string_lossy();
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("zmem-capi-c");
    fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join(format!("{name}-{link:?}").to_lowercase());
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut cmd = Command::new(&cc);
    cmd.args([
        "-std=c11",
        "-O2",
        "-Wall",
        "-Wextra",
        "-pedantic",
        "-Werror",
    ])
    .arg("-I")
    .arg(root.join("include"))
    .arg(source)
    .arg("-o")
    .arg(&exe);
    match link {
        Link::Static => {
            cmd.arg(lib_dir.join("libzmem.a")).args(STATIC_LIBS);
        }
        Link::Shared => {
            cmd.arg("-L")
                .arg(&lib_dir)
                .arg("-lzmem")
                .arg(format!("-Wl,-rpath,{}", lib_dir.display()));
        }
    }
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(output.status.success(), "{cmd:?} failed\n{}", show(&output));
    exe
}

fn run(exe: &Path) -> Output {
    Command::new(exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()))
}

#[test]
fn c_error_paths_static_and_shared() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/errors.c");
    for link in [Link::Static, Link::Shared] {
        let exe = build_c(&source, link);
        let output = run(&exe);
        let text = show(&output);
        assert!(output.status.success(), "{link:?}: {text}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("ALL OK"), "{link:?}: {text}");
        assert!(!stdout.contains("FAIL"), "{link:?}: {text}");
        // The messages reach C intact.
        assert!(
            stdout.contains("ok size 0: zmem_region_create: size is 0"),
            "{text}"
        );
    }
}

/// Why this process cannot open /dev/userfaultfd, if it cannot.
fn userfaultfd_unavailable() -> Option<String> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
    {
        Ok(_) => None,
        Err(e) => Some(format!("cannot open /dev/userfaultfd: {e}")),
    }
}

#[test]
fn c_example_region() {
    let source = workspace_root().join("examples/c/region.c");
    // Both link modes must build whether or not the example can run here.
    let exe = build_c(&source, Link::Static);
    build_c(&source, Link::Shared);

    let output = run(&exe);
    let text = show(&output);
    if !output.status.success() {
        // Exit 77: zmem_region_create said ZMEM_PERMISSION.
        let denied = output.status.code() == Some(77);
        if let (true, Some(reason)) = (denied, userfaultfd_unavailable()) {
            eprintln!("SKIPPED c_example_region: {reason} (the example needs userfaultfd)\n{text}");
            return;
        }
        if let Some(reason) = userfaultfd_unavailable() {
            eprintln!("SKIPPED c_example_region: {reason}; the example failed:\n{text}");
            return;
        }
        panic!("examples/c/region.c failed\n{text}");
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    for want in [
        "region: 64 MiB, resident budget 8 MiB",
        "wrote 16384 pages",
        "verified 16384 pages twice",
        "evictions: ",
        "ratio: ",
    ] {
        assert!(stdout.contains(want), "missing {want:?}\n{text}");
    }
    assert!(stdout.ends_with("OK\n"), "{text}");
    println!("{stdout}");
}

#[test]
fn c_heap_static_and_shared() {
    // tests/c/heap.c: objects through a small budget, the error paths, an SSD tier in a temp
    // directory, destroy with live blocks.
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/heap.c");
    let ssd = tempfile::tempdir().expect("temp dir for the SSD tier");
    for link in [Link::Static, Link::Shared] {
        let exe = build_c(&source, link);
        let output = Command::new(&exe)
            .arg(ssd.path())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
        let text = show(&output);
        if output.status.code() == Some(77) {
            if let Some(reason) = userfaultfd_unavailable() {
                eprintln!("SKIPPED c_heap: {reason}\n{text}");
                return;
            }
        }
        assert!(
            output.status.success(),
            "{link:?}: tests/c/heap.c failed\n{text}"
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        for want in ["dram: ", "error paths checked", "ssd: "] {
            assert!(stdout.contains(want), "{link:?}: missing {want:?}\n{text}");
        }
        assert!(stdout.ends_with("OK\n"), "{link:?}: {text}");
        println!("{link:?}:\n{stdout}");
    }
}
