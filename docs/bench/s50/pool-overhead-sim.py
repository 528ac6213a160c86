import math, collections, sys
PAGE=4096
def choose(size, maxp, div):
    minp=max(1,-(-size//PAGE)); best=None
    for p in range(minp, maxp+1):
        span=p*PAGE; objs=span//size; w=span-objs*size
        if objs==0 or objs>8192: continue
        if w*div<=span: return (p,objs)
        if best is None or w*best[1] < best[0]*span: best=(w,span,p,objs)
    return (best[2],best[3])
sizes=[int(x) for x in open(sys.argv[1])]
def run(maxp, div, hdr, reps):
    cnt=collections.Counter()
    for s in sizes:
        s=s+hdr
        if s>=4096: s=4096
        cnt[-(-s//16)*16]+=reps
    # merge: objects in classes with same geometry -> per-geometry groups (merge range ignored)
    groups=collections.Counter()
    for cs,n in cnt.items():
        g=choose(cs,maxp,div); groups[(g, )]+=0
    mem=0; objb=0; full=0
    # group by representative: consecutive sizes with same geo merge; approximate with geometry+size>>12 bucket
    geo_n=collections.Counter()
    for cs,n in cnt.items():
        g=choose(cs,maxp,div); geo_n[g]+=n
    for (p,o),n in geo_n.items():
        spans=-(-n//o); mem+=spans*p*PAGE; full+= n*p*PAGE/o
    ob=sum(min(s+hdr,4096) for s in sizes)*reps
    return mem, ob, full
for maxp,div in [(16,64),(16,128),(16,256),(32,256),(32,1024)]:
    for reps in [1,167]:
        mem,ob,full=run(maxp,div,0,reps)
        print(maxp,div,reps, "ratio by mem %.4f by obj %.4f  overhead %.2f%%  (no-partial %.2f%%)"%(794*4096*reps/mem, 794*4096*reps/ob, (mem/ob-1)*100, (full/ob-1)*100))
