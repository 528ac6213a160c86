#!/bin/bash
# Programs nobody tuned zmem for, each run plain once and under `zmem run --resident BUDGET
# --trace-pages`, the output compared with the plain run's (session 30).
# usage: [ZMEM_RUN_ARGS="--policy auto"] run.sh ZMEM BUDGET [OUTDIR]   e.g. run.sh ./target/release/zmem 4M /tmp/untuned
set -u
zmem=$(realpath "$1"); budget=$2; out=${3:-/tmp/zmem-untuned}
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../../.." && pwd)
mkdir -p "$out"; cd "$out"
jobs=(
  "awk|awk -f $here/big.awk"
  "tcl|tclsh $here/dicts.tcl"
  "node|node $here/maps.js"
  "git|git -C $repo log -p --stat -n 400"
  "bc|bc -l -q <<< 'scale=3000; 4*a(1)'"
  "sqlite|sqlite3 :memory: 'with recursive c(x) as (select 1 union all select x+1 from c where x<300000) select count(*), sum(length(hex(randomblob(0)))+x%97), max(x) from c; create table t(a,b); with recursive c(x) as (select 1 union all select x+1 from c where x<200000) insert into t select x, printf(\"%08d-%s\", (x*7919)%200003, x) from c; create index i on t(b); select b from t order by b limit 5 offset 100000; select count(distinct a%1000) from t;'"
  "python|python3 -c 'import json,hashlib; d={str(i*7919%1000003):[i,str(i)*3] for i in range(300000)}; s=json.dumps(d,sort_keys=True); print(len(s), hashlib.md5(s.encode()).hexdigest())'"
)
for job in "${jobs[@]}"; do
  name=${job%%|*}; cmd=${job#*|}
  [ -s "ref.$name" ] || bash -c "$cmd" > "ref.$name"
  t0=$(date +%s.%N)
  timeout 900 "$zmem" run --resident "$budget" ${ZMEM_RUN_ARGS:-} --trace-pages --stats "stats.$name.$budget.json" \
    -- bash -c "$cmd" > "out.$name.$budget" 2> "err.$name.$budget"
  rc=$?
  secs=$(echo "$(date +%s.%N) - $t0" | bc)
  if cmp -s "out.$name.$budget" "ref.$name"; then same=same; else same=DIFFERENT; fi
  ev=$(jq -r '.zmem.region.evictions' "stats.$name.$budget.json" 2>/dev/null)
  echo "$name $budget exit=$rc output=$same ${secs}s evictions=$ev" | tee -a log
done
