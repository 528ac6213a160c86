#!/usr/bin/env bash
# Builds the Debian package and tests it installed: unpacked into a scratch root (dpkg -x), the
# installed zmem runs a program (finding its preload library in <root>/usr/lib/zmem), `zmem
# doctor` passes, and examples/c/region.c compiles against the installed zmem.h and libzmem.so
# through `pkg-config --cflags --libs zmem` and runs. As root with ZMEM_DEB_INSTALL=1, it also
# installs the package for real (dpkg -i), runs the same checks on /usr, and removes it (dpkg -r).
set -euo pipefail
cd "$(dirname "$0")/.."

packaging/build-deb.sh
deb=$(ls -t target/debian/zmem_*_amd64.deb | head -1)
echo "== $deb"
dpkg-deb --info "$deb" | sed -n '/Package:/,/Description:/p'
dpkg-deb --contents "$deb"

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
dpkg -x "$deb" "$root"

check() { # $1: the root the package is in ("" for /)
  local r=$1 zmem=$1/usr/bin/zmem
  echo "== $zmem run --resident 16M -- true"
  env -u ZMEM_PRELOAD "$zmem" run --resident 16M -- true
  echo "== $zmem doctor"
  env -u ZMEM_PRELOAD "$zmem" doctor
  echo "== examples/c/region.c with pkg-config --cflags --libs zmem"
  local flags exe=$root/region
  # PKG_CONFIG_SYSROOT_DIR prefixes the .pc's -I and -L with the scratch root.
  flags=$(PKG_CONFIG_PATH=$r/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=$r \
    pkg-config --cflags --libs zmem)
  echo "   flags: $flags"
  cc -std=c11 -O2 -Wall -Wextra examples/c/region.c $flags -o "$exe"
  local rc=0
  LD_LIBRARY_PATH=$r/usr/lib/x86_64-linux-gnu "$exe" || rc=$?
  # 77: this user may not use userfaultfd (the C example's skip status).
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || { echo "region.c failed with status $rc" >&2; exit 1; }
}
check "$root"

if [ "${ZMEM_DEB_INSTALL:-0}" = 1 ] && [ "$(id -u)" = 0 ]; then
  if dpkg -s zmem >/dev/null 2>&1; then
    echo "== zmem is already installed: not installing over it"
  else
    echo "== dpkg -i (removed again at the end)"
    dpkg -i "$deb"
    trap 'dpkg -r zmem >/dev/null; rm -rf "$root"' EXIT
    check ""
    dpkg -r zmem
    trap 'rm -rf "$root"' EXIT
  fi
fi
echo "== the package works"
