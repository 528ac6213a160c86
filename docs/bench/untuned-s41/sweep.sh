#!/bin/bash
# Programs that fork, spawn and pipe (session 41), output compared with a plain run: session
# 40's sweep over this folder's cmds.txt (NAME|SHELL LINE; inputs made by setup.sh in /tmp/s41).
# usage: sweep.sh ZMEM BUDGET ROUTE [NAME...]   e.g. sweep.sh ./target/release/zmem 4M signal
here=$(cd "$(dirname "$0")" && pwd)
CMDS="$here/cmds.txt" exec "$here/../untuned-s40/sweep.sh" "$@"
