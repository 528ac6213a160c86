#!/bin/bash
# Programs nobody tuned zmem for (session 40), output compared with a plain run. Each line of
# cmds.txt is NAME|SHELL LINE; the inputs are made by setup.sh (in /tmp/s40).
# usage: sweep.sh ZMEM BUDGET ROUTE [NAME...]   e.g. sweep.sh ./target/release/zmem 4M signal
# (CMDS=FILE: another list of the same form, as docs/bench/untuned-s41/sweep.sh gives)
set -u
z=$1; b=$2; r=$3; shift 3; here=$(cd "$(dirname "$0")" && pwd)
while IFS='|' read -r name line; do
  if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$name"; then continue; fi
  p0=$(date +%s.%N); exp=$(timeout 300 bash -c "$line" 2>&1); t0=$(date +%s.%N)
  got=$(timeout 600 "$z" run --resident "$b" --quiet --fault-route "$r" -- bash -c "$line" 2>&1); rc=$?
  t1=$(date +%s.%N)
  if [ "$exp" == "$got" ]; then s=same; else s=DIFF; fi
  printf "%-8s %-5s %-8s rc=%-3s %s zmem %.1fs plain %.1fs\n" "$name" "$b" "$r" $rc $s \
    "$(echo "$t1-$t0" | bc)" "$(echo "$t0-$p0" | bc)"
  if [ $s = DIFF ]; then echo "  plain: ${exp:0:300}"; echo "  zmem:  ${got:0:600}"; fi
done < "${CMDS:-$here/cmds.txt}"
