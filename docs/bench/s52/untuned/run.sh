#!/bin/bash
# Session 49's untuned programs and session 52's python heap of five Silesia files (cmds52.txt). Inputs, made beside it: /tmp/gocgo from gocgo-main.go
# (go build with cgo), /tmp/jv from Prog.java (javac), /tmp/pymp.py, /tmp/mk (six generated C files
# and a Makefile), /tmp/bigtext.txt (32 MB of random words and numbers, python's random, seed 3).
# usage: run.sh BUDGET ; runs each line of cmds.txt plain and under zmem, compares outputs
Z=/work/main/target/release/zmem
while IFS='|' read -r name cmd; do
  [ -z "$name" ] && continue
  t0=$(date +%s.%N); p=$(timeout 300 bash -c "$cmd" 2>&1); prc=$?; t1=$(date +%s.%N)
  z=$(timeout 600 $Z run --resident $1 $ZARGS --quiet -- bash -c "$cmd" 2>&1); zrc=$?; t2=$(date +%s.%N)
  same=$([ "$p" == "$z" ] && echo same || echo DIFFERENT)
  printf "%-8s %s plain rc=%d %.2fs  zmem rc=%d %.2fs  %s\n" $name $1 $prc $(echo "$t1-$t0"|bc) $zrc $(echo "$t2-$t1"|bc) $same
  [ "$same" == same ] || { echo "  plain: ${p:0:300}"; echo "  zmem: ${z:0:300}"; }
done < ${CMDS:-cmds52.txt}
