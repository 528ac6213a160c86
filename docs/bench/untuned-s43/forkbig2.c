// Session 43: fork + exec of /bin/true + waitpid N times from a program with a heap of MB
// megabytes in 64 KiB blocks (one byte per cache line written). Prints the time per round and
// per fork(). usage: forkbig2 MB N   e.g. zmem run --resident 16M -- ./forkbig2 64 20
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
int main(int c,char**v){ size_t mb=atoi(v[1]); int n=atoi(v[2]); char **blocks=malloc(mb*16*sizeof(char*));
 for(size_t i=0;i<mb*16;i++){ blocks[i]=malloc(65536); for(int j=0;j<65536;j+=64) blocks[i][j]=(char)(i+j/64); }
 double t0=now(), tf=0;
 for(int i=0;i<n;i++){ double a=now(); pid_t p=fork(); if(p==0){ execl("/bin/true","true",(char*)0); _exit(127);} tf+=now()-a; int st; waitpid(p,&st,0);} 
 double t=now()-t0; printf("%zu MB: %.2f ms per fork+exec+wait, fork() %.2f ms\n", mb, t/n, tf/n); }
