#!/bin/bash
# Inputs for sweep.sh (session 41): a small C project for make, a git repository with history.
set -eu
d=/tmp/s41; rm -rf $d; mkdir -p $d/mk
cd $d/mk
for i in $(seq 1 24); do
  printf '#include <stdio.h>\nint f%d(int x) { int s = 0; for (int i = 0; i < x; i++) s += i * %d; return s; }\n' $i $i > f$i.c
done
{ echo '#include <stdio.h>'; for i in $(seq 1 24); do echo "int f$i(int);"; done
  echo 'int main(void) { long t = 0;'; for i in $(seq 1 24); do echo "t += f$i(1000);"; done
  echo 'printf("%ld\n", t); return 0; }'; } > main.c
cat > Makefile <<'MK'
SRCS := $(wildcard *.c)
OBJS := $(SRCS:.c=.o)
prog: $(OBJS)
	$(CC) -o $@ $(OBJS)
%.o: %.c
	$(CC) -O2 -c $< -o $@
MK
mkdir -p $d/repo && cd $d/repo && git init -q . && for i in $(seq 1 40); do
  seq $i 3 $((i * 500)) > file$((i % 7)).txt
  git add -A && GIT_AUTHOR_DATE="2026-01-01T00:00:$((i % 60))Z" GIT_COMMITTER_DATE="2026-01-01T00:00:$((i % 60))Z" \
    git -c user.name=z -c user.email=z@z commit -qm "c$i"
done
