#!/bin/bash
# one round: V in plain|0|A|B ; prints SET/s GET/s peakRSS(MB) peak(res+pool) settled(res+pool) end rss
V=$1; RES=${RES:-128M}; PORT=${PORT:-6412}; Z=/work/exp/zmemA
if [ $V = plain ]; then redis-server --port $PORT --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & ZP=$!
else $Z run --preload /work/exp/lib$V.so --resident $RES -- redis-server --port $PORT --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & ZP=$!; fi
trap 'kill $ZP 2>/dev/null; wait $ZP 2>/dev/null' EXIT
for i in $(seq 50); do redis-cli -p $PORT ping >/dev/null 2>&1 && break; sleep 0.2; done
S=/tmp/ab-$V-$$.txt
( while kill -0 $ZP 2>/dev/null; do
   R=$(awk '/VmRSS/{print $2}' /proc/$ZP/status 2>/dev/null)
   if [ $V != plain ]; then $Z stat --json $ZP 2>/dev/null | python3 -c "
import json,sys; j=json.load(sys.stdin); r=j['region']; s=r['store']; print($R, r['resident']+s['mem_used_total'], s['entropy_tries'])" 2>/dev/null; else echo "$R 0 0"; fi
   sleep 0.5; done ) > $S &
SP=$!
SET=$(redis-benchmark -p $PORT -t set -n 200000 -r 150000 -d 4000 -P 16 -c 4 -q 2>&1 | tr '\r' '\n' | grep "requests per" | awk '{print $2}')
sleep 10
GET=$(redis-benchmark -p $PORT -t get -n 200000 -r 150000 -d 4000 -P 16 -c 4 -q 2>&1 | tr '\r' '\n' | grep "requests per" | awk '{print $2}')
CPU=$(awk '{print ($14+$15)/100}' /proc/$ZP/stat)
kill $SP; wait $SP 2>/dev/null
python3 - $S <<PY
import sys
rows=[l.split() for l in open(sys.argv[1]) if l.strip()]
rss=[int(r[0])/1024 for r in rows]; rp=[int(r[1])/2**20 for r in rows]
print(f"$V SET {float('$SET'):.0f} GET {float('$GET'):.0f} cpu ${CPU} peakRSS {max(rss):.0f} endRSS {rss[-1]:.0f} peak_res+pool {max(rp):.0f} end_res+pool {rp[-1]:.0f}")
PY
rm -f $S
