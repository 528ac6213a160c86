#!/bin/bash
# Programs nobody tuned zmem for, beside the kernel at a 32M limit (session 38): each shell line
# runs plain, under `zmem run --resident 32M` and in a memory cgroup limited to 32M with zram
# swap, its output compared (`zmem bench programs --command`). Needs root for the kernel side.
# usage: run.sh ZMEM [OUTDIR]    e.g. run.sh ./target/release/zmem /tmp/untuned-s38
set -eu
zmem=$(realpath "$1"); out=${2:-/tmp/untuned-s38}
here=$(cd "$(dirname "$0")" && pwd); shared=$(cd "$here/../../../../shared" && pwd)
mkdir -p "$out"; cd "$out"
# Inputs: 30 MB of the test corpora; 54 MB of base64 lines (random, so no two runs share them,
# but the three sides of one run read the same file).
[ -s corp.bin ] || cat "$shared"/corpora/*/* 2>/dev/null | head -c 30000000 > corp.bin
[ -s in.txt ] || head -c 40000000 /dev/urandom | base64 > in.txt
perl_line='perl -e '"'"'my %h; for my $i (1..400000) { $h{"k".($i*7919%1000003)} = [$i, "v" x ($i%50)] } my $s=0; for (sort keys %h) { $s += length($_) + $h{$_}[0] } print "$s\n"'"'"
"$zmem" bench programs --resident 32M --repeat 1 --timeout 450 \
  --command "xz6t2=xz -6 -T2 -c $out/corp.bin | md5sum" \
  --command "sortu=sort -u $out/in.txt | md5sum" \
  --command "perlhash=$perl_line" \
  --json xz-sort-perl-32M.json --plot xz-sort-perl-32M.svg | tee xz-sort-perl-32M.txt
"$zmem" bench programs --resident 32M --repeat 3 --timeout 300 \
  --command "java=java -Xmx256m -XX:+UseSerialGC $here/H.java" \
  --command "pytest=python3 -m test -q test_json test_re test_bisect 2>&1 | grep -E '^(Result|Total tests)'" \
  --command "sortu=sort -u $out/in.txt | md5sum" \
  --json java-pytest-sort-32M.json --plot java-pytest-sort-32M.svg | tee java-pytest-sort-32M.txt
