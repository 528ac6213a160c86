#!/bin/bash
# Inputs of sweep.sh (session 40), in /tmp/s40: a CMake/Ninja project of 25 C++ files, 41 Java
# classes, a cgo program (Go code reading C memory), an npm package with one script.
set -eu
mkdir -p /tmp/s40/cpp/src /tmp/s40/java /tmp/s40/cgo /tmp/s40/npmp
cd /tmp/s40
for i in $(seq 1 24); do cat > cpp/src/u$i.cpp <<EOF
#include <map>
#include <regex>
#include <string>
#include <vector>
#include <algorithm>
#include <sstream>
std::string u$i(int n) {
  std::map<std::string, std::vector<int>> m;
  std::regex re("([a-z]+)([0-9]*)");
  for (int k = 0; k < n; k++) { std::ostringstream o; o << "k" << (k * $i % 97); m[o.str()].push_back(k); }
  std::string s; for (auto &p : m) { std::smatch sm; if (std::regex_match(p.first, sm, re)) s += sm[1].str() + std::to_string(p.second.size()); }
  std::sort(s.begin(), s.end());
  return s.substr(0, 8);
}
EOF
done
{ echo '#include <string>'; echo '#include <cstdio>'; for i in $(seq 1 24); do echo "std::string u$i(int);"; done
  echo 'int main(){'; for i in $(seq 1 24); do echo "printf(\"%s\\n\", u$i(2000).c_str());"; done; echo '}'; } > cpp/src/main.cpp
cat > cpp/CMakeLists.txt <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(s40 CXX)
file(GLOB SRC src/*.cpp)
add_executable(s40 ${SRC})
target_compile_options(s40 PRIVATE -O2)
EOF
for i in $(seq 1 40); do cat > java/C$i.java <<EOF
import java.util.*;
import java.util.stream.*;
public class C$i {
  public static String f(int n) {
    Map<String, List<Integer>> m = new TreeMap<>();
    for (int k = 0; k < n; k++) m.computeIfAbsent("k" + (k * $i % 101), x -> new ArrayList<>()).add(k);
    return m.entrySet().stream().map(e -> e.getKey() + e.getValue().size()).collect(Collectors.joining(",")).substring(0, 10);
  }
}
EOF
done
{ echo 'public class Main { public static void main(String[] a) {'; for i in $(seq 1 40); do echo "System.out.println(C$i.f(20000));"; done; echo '}}'; } > java/Main.java
cat > cgo/go.mod <<'EOF'
module cgo40
go 1.21
EOF
cat > cgo/main.go <<'EOF'
package main

/*
#include <stdlib.h>
static char *fill(int i, int n) {
	char *p = malloc(n);
	for (int k = 0; k < n; k++) p[k] = (char)('a' + (k * 7 + i) % 26);
	return p;
}
static unsigned long csum(char *p, int n) {
	unsigned long s = 0;
	for (int k = 0; k < n; k++) s = s * 31 + (unsigned char)p[k];
	return s;
}
*/
import "C"

import (
	"crypto/sha256"
	"fmt"
	"unsafe"
)

func main() {
	const n = 1 << 16
	bufs := make([]*C.char, 0, 1024)
	for i := 0; i < 1024; i++ {
		bufs = append(bufs, C.fill(C.int(i), n))
	}
	h := sha256.New()
	for round := 0; round < 2; round++ {
		for i, p := range bufs {
			if i%2 == 0 {
				h.Write(unsafe.Slice((*byte)(unsafe.Pointer(p)), n)) // Go code reads C memory
			} else {
				fmt.Fprintf(h, "%d", uint64(C.csum(p, n)))
			}
		}
	}
	for _, p := range bufs {
		C.free(unsafe.Pointer(p))
	}
	fmt.Printf("%x\n", h.Sum(nil))
}
EOF
(cd cgo && GOFLAGS=-mod=mod GOCACHE=/tmp/s40/gocache go build -o cgo40 .)
cat > npmp/package.json <<'EOF'
{ "name": "s40", "version": "1.0.0", "scripts": { "t": "node -e \"let a=[];for(let i=0;i<300000;i++)a.push({k:'x'+i,v:i*2});console.log(a.filter(o=>o.v%3==0).length)\"" } }
EOF
echo "inputs ready in /tmp/s40"
