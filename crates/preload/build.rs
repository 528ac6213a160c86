//! Links the library's own calls to the functions it defines (malloc, free, mmap, ...) to its
//! own definitions (`-Bsymbolic-functions`), whatever the program defines. A program that
//! exports its own allocator (rustc exports jemalloc's malloc from its executable) otherwise
//! got some of this library's calls (std's `System`, the C codecs' malloc) and not others
//! (a `free` bound here), so a block crossed allocators: glibc's free of a jemalloc block at
//! exit (docs/DESIGN-NOTES.md, "rustc").
//!
//! Links the unwinder statically (libgcc_eh, ahead of std's `-lgcc_s`, which `--as-needed`
//! then drops): loading libgcc_s.so ran its constructor's cpuid probes, each a VM exit on a
//! virtual machine, ~0.1 ms in every process the run execs (docs/DESIGN-NOTES.md, "What a
//! process pays before zmem starts"). It stays private: the library exports only its own
//! symbols, so a C++ program keeps its own unwinder.
//!
//! Checks that mimalloc is built without its load-time constructor (.cargo/config.toml); if
//! the C flags cc uses say otherwise, a process that starts zmem late runs mimalloc's start
//! at once, as before (`cfg(mimalloc_constructor)`).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");

    println!("cargo::rustc-check-cfg=cfg(mimalloc_constructor)");
    if !mimalloc_without_constructor() {
        println!("cargo:rustc-cfg=mimalloc_constructor");
        println!(
            "cargo:warning=mimalloc is built with its load-time constructor: the C flags cc \
             uses lack -DMI_PRIM_HAS_PROCESS_ATTACH (.cargo/config.toml sets it), so every \
             process the run execs pays mimalloc's start"
        );
    }
}

/// Whether the C flags cc-rs takes for the target (the first of `CFLAGS_<target>`,
/// `CFLAGS_<target_with_underscores>`, `HOST_CFLAGS` or `TARGET_CFLAGS`, `CFLAGS` that is
/// set) define `MI_PRIM_HAS_PROCESS_ATTACH`.
fn mimalloc_without_constructor() -> bool {
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    let kind = if host == target { "HOST" } else { "TARGET" };
    let names = [
        format!("CFLAGS_{target}"),
        format!("CFLAGS_{}", target.replace('-', "_")),
        format!("{kind}_CFLAGS"),
        "CFLAGS".to_string(),
    ];
    for name in &names {
        println!("cargo:rerun-if-env-changed={name}");
    }
    names
        .iter()
        .find_map(|n| std::env::var(n).ok())
        .is_some_and(|flags| {
            flags
                .split_whitespace()
                .any(|f| f == "-DMI_PRIM_HAS_PROCESS_ATTACH")
        })
}
