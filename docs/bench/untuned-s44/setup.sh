#!/bin/bash
# Inputs of session 44's sweep (in /tmp/s44): a CMake + Ninja project, a tar source tree.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
d=/tmp/s44; mkdir -p $d/cm/src; cd $d/cm
for i in $(seq 1 12); do
  printf '#include <stdio.h>\nint f%d(int x){int s=0; for(int i=0;i<x;i++) s+=i*%d; return s;}\n' $i $i > src/f$i.c
done
{ echo '#include <stdio.h>'; for i in $(seq 1 12); do echo "int f$i(int);"; done
  echo 'int main(void){long s=0;'; for i in $(seq 1 12); do echo "s+=f$i(1000);"; done
  echo 'printf("%ld\n",s);return 0;}'; } > src/main.c
cat > CMakeLists.txt <<'CM'
cmake_minimum_required(VERSION 3.13)
project(s44 C)
file(GLOB SRC src/*.c)
add_executable(prog ${SRC})
CM
cp -r /work/shared/corpora/calgary $d/tree
# A cgo Go program (four goroutines filling 1 MiB slices, C mallocs), when Go is installed.
if command -v go >/dev/null; then
  mkdir -p $d/cgo2 && cp "$here"/cgo/* $d/cgo2/ && (cd $d/cgo2 && CGO_ENABLED=1 go build -o cgo2 .)
fi
