#!/bin/bash
# Session 43: the eight process-heavy programs of session 42 (../untuned-s42/cmds.txt) beside
# the kernel at one budget. Inputs: ../untuned-s41/setup.sh.
# usage: programs.sh ZMEM BUDGET OUT_PREFIX [extra bench args...]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
zmem=$1 budget=$2 out=$3; shift 3
args=()
while IFS='|' read -r name cmd; do
  case $name in make|pysub|pypool|perlsys|xargs|gitgc|nodecp|bashsub) args+=(--command "$name=$cmd") ;; esac
done < "$here/../untuned-s42/cmds.txt"
"$zmem" bench programs --resident "$budget" --repeat 3 "${args[@]}" --json "$out.json" "$@" 2>&1 | tee "$out.txt"
