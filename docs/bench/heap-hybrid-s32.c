// Experiment (session 32): mimalloc for everything except requests of LO..HI bytes, which go
// to glibc's best-fit malloc. Shows how much of mimalloc's extra footprint the mid-size
// classes account for. free/realloc/usable_size route by asking mimalloc whether it owns the
// pointer (mi_is_in_heap_region). An experiment, not zmem code: glibc's usable size is read
// from its chunk header, and realloc always moves.
// Build, with MI the mimalloc v3 sources of the libmimalloc-sys crate (c_src/mimalloc/v3):
//   gcc -O2 -shared -fPIC -DNDEBUG -I$MI/include heap-hybrid-s32.c $MI/src/static.c -o hyb.so -lpthread
// Run: LD_PRELOAD=./hyb.so MIMALLOC_PURGE_DELAY=0 sqlite3 -batch :memory: < script.sql
#define _GNU_SOURCE
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
extern void *__libc_malloc(size_t); extern void __libc_free(void*); extern void *__libc_realloc(void*,size_t);
extern void *__libc_calloc(size_t,size_t); extern void *__libc_memalign(size_t,size_t);
extern size_t __malloc_usable_size(void*) __attribute__((weak));
void *mi_malloc(size_t); void mi_free(void*); void *mi_realloc(void*,size_t); void *mi_calloc(size_t,size_t);
void *mi_malloc_aligned(size_t,size_t); size_t mi_usable_size(const void*); bool mi_is_in_heap_region(const void*);
static size_t LO=1025, HI=32768;
static bool mid(size_t n){ return n>=LO && n<=HI; }
static size_t glibc_usable(void *p){ return ((size_t*)p)[-1] & ~(size_t)7; } // approx, minus header below
void *malloc(size_t n){ return mid(n)? __libc_malloc(n) : mi_malloc(n); }
void *calloc(size_t a,size_t b){ size_t n=a*b; return mid(n)? __libc_calloc(a,b) : mi_calloc(a,b); }
void free(void *p){ if(!p) return; if(mi_is_in_heap_region(p)) mi_free(p); else __libc_free(p); }
size_t malloc_usable_size(void *p){ if(!p) return 0; if(mi_is_in_heap_region(p)) return mi_usable_size(p); return glibc_usable(p)-8; }
void *realloc(void *p,size_t n){
  if(!p) return malloc(n);
  size_t old = malloc_usable_size(p);
  void *q = malloc(n); if(!q) return NULL;
  memcpy(q,p, old<n?old:n); free(p); return q;
}
int posix_memalign(void **r,size_t a,size_t n){ *r=mi_malloc_aligned(n,a); return *r?0:12; }
void *aligned_alloc(size_t a,size_t n){ return mi_malloc_aligned(n,a); }
void *memalign(size_t a,size_t n){ return mi_malloc_aligned(n,a); }
