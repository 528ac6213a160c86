# Session 54 (written in session 53, whose work was lost): forks while the parent frees and rebuilds large structures (the class of the
# fork_race hang): a pool of forked workers reads a big list; between rounds the parent drops
# it and builds another, so its free of evicted blocks runs while the children still hold
# their copy-on-write view. Prints a checksum that does not depend on the timing.
import multiprocessing as mp
import os

def build(r):
    return [("%d-%d-" % (r, i)) * 8 for i in range(200000)]

data = build(0)

def work(k):
    return sum(len(s) for s in data[k::7]) + k

if __name__ == "__main__":
    mp.set_start_method("fork")
    total = 0
    for r in range(4):
        with mp.Pool(2) as p:
            res = p.map_async(work, range(7))
            # The parent frees the list its children read and builds the next one meanwhile.
            data = None
            data = build(r + 1)
            total += sum(res.get())
    print(total)
