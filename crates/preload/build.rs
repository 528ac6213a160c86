//! Links the library's own calls to the functions it defines (malloc, free, mmap, ...) to its
//! own definitions (`-Bsymbolic-functions`), whatever the program defines. A program that
//! exports its own allocator (rustc exports jemalloc's malloc from its executable) otherwise
//! got some of this library's calls (std's `System`, the C codecs' malloc) and not others
//! (a `free` bound here), so a block crossed allocators: glibc's free of a jemalloc block at
//! exit (docs/DESIGN-NOTES.md, "rustc").
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
