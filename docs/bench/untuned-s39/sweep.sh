#!/bin/bash
# Programs nobody tuned zmem for, in the user's locale (C.UTF-8 here), output compared with a
# plain run (session 39). Each line of cmds.txt is NAME|SHELL LINE, run in the directory that
# holds mid.txt (20 MB of base64 lines: `head -c 15000000 /dev/urandom | base64 > mid.txt`).
# usage: sweep.sh ZMEM BUDGET ROUTE    e.g. sweep.sh ./target/release/zmem 4M signal
set -u
z=$1; b=$2; r=$3; here=$(cd "$(dirname "$0")" && pwd)
while IFS='|' read -r name line; do
  p0=$(date +%s.%N); exp=$(timeout 120 bash -c "$line" 2>&1); t0=$(date +%s.%N)
  got=$(timeout 300 "$z" run --resident "$b" --quiet --fault-route "$r" -- bash -c "$line" 2>&1); rc=$?
  t1=$(date +%s.%N)
  if [ "$exp" == "$got" ]; then s=same; else s=DIFF; fi
  printf "%-8s %-5s %-8s rc=%-3s %s zmem %.1fs plain %.1fs\n" "$name" "$b" "$r" $rc $s \
    "$(echo "$t1-$t0" | bc)" "$(echo "$t0-$p0" | bc)"
  if [ $s = DIFF ]; then echo "  plain: ${exp:0:200}"; echo "  zmem:  ${got:0:300}"; fi
done < "$here/cmds.txt"
