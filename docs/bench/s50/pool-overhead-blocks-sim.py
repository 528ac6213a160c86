import collections, sys
PAGE=4096
def rng(size, maxp):
    minp=max(1,-(-size//PAGE))
    if size<=PAGE: return minp, maxp
    return minp, max(maxp, min(4*minp,128), minp)
def choose(size, maxp=16, div=64):
    lo,hi=rng(size,maxp); best=None
    for p in range(lo,hi+1):
        span=p*PAGE; objs=span//size; w=span-objs*size
        if objs==0 or objs>8192: continue
        if w*div<=span: return (p,objs)
        if best is None or w*best[1]<best[0]*span: best=(w,span,p,objs)
    return (best[2],best[3])
sizes=[int(x)+int(sys.argv[2]) for x in open(sys.argv[1])]
def sim(step_fn, div=64):
    cnt=collections.Counter()
    for s in sizes:
        cnt[step_fn(s)]+=1
    geo=collections.Counter()
    for cs,n in cnt.items():
        geo[(cs,)+choose(cs,16,div)]+=n   # per class (merging ignored: same geometry merges only adjacent)
    # merge adjacent classes with same geometry: approximate by grouping on geometry
    g2=collections.Counter()
    for (cs,p,o),n in geo.items(): g2[(p,o)]+=n
    mem=sum(-(-n//o)*p*PAGE for (p,o),n in g2.items())
    return mem
ob=sum(sizes)
for name,fn in [('16B', lambda s: -(-s//16)*16),
                ('1/64', lambda s: s if s<=4096 else -(-s//max(16,(s//64)//16*16))*max(16,(s//64)//16*16)),
                ('1/128', lambda s: s if s<=4096 else -(-s//max(16,(s//128)//16*16))*max(16,(s//128)//16*16)),
                ('256B', lambda s: -(-s//256)*256 if s>4096 else -(-s//16)*16)]:
    for div in (64,256):
        mem=sim(fn,div)
        print(name, div, "overhead %.2f%%"%((mem/ob-1)*100), "ratio by mem %.3f"%(len(sizes)*65536/mem))
cnt=collections.Counter(-(-s//16)*16 for s in sizes)
full=0; g2=collections.Counter(); tails=0
for cs,n in cnt.items():
    p,o=choose(cs); full+=n*p*PAGE/o; g2[(p,o)]+=n
print("classes", len(cnt), "geometries", len(g2), "full-span overhead %.2f%%"%((full/ob-1)*100))
ps=collections.Counter(p for (p,o) in g2); print(sorted(ps.items())[:20])
