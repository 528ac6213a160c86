#!/bin/bash
# Session 42: session 41's twelve programs that fork, spawn and pipe, with the late start of the
# processes they exec (zmem run's default --start-at), output compared with a plain run.
# Inputs: ../untuned-s41/setup.sh. usage: sweep.sh ZMEM BUDGET ROUTE [NAME...]
here=$(cd "$(dirname "$0")" && pwd)
CMDS="$here/cmds.txt" exec "$here/../untuned-s40/sweep.sh" "$@"
