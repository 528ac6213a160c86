#!/usr/bin/env bash
# Builds the Debian package of zmem into target/debian/zmem_<version>_amd64.deb.
#
# cargo-deb builds only the zmem-cli crate, but the package also carries two cdylibs of other
# crates (libzmem_preload.so, libzmem.so): build the whole workspace in release first, then
# package without building. cargo-deb is installed when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo deb --version >/dev/null 2>&1; then
  echo "== installing cargo-deb"
  cargo install cargo-deb --locked
fi
cargo build --release --workspace
# The version of zmem.pc must be the crate's.
version=$(cargo pkgid -p zmem-cli | sed 's/.*[#@]//')
grep -qx "Version: $version" packaging/zmem.pc || {
  echo "packaging/zmem.pc does not say Version: $version" >&2
  exit 1
}
# The release profile keeps debug info (for perf); the package ships stripped binaries.
cargo deb -p zmem-cli --no-build --strip "$@"
