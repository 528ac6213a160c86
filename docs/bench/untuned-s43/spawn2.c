// Session 43: posix_spawn + waitpid of a program N times, VAR=value... set for the child only.
// Prints the mean and the fastest round. usage: spawn2 N [VAR=value...] -- PROGRAM
// e.g. spawn2 400 LD_PRELOAD=$PWD/target/release/libzmem_preload.so ZMEM_RUN_PID=1 -- /bin/true
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
extern char **environ;
/* spawn2 N VAR=val... -- prog */
int main(int c, char **v){ int n=atoi(v[1]); char *envp[512]; int k=0; int i=2;
 for(;i<c && strcmp(v[i],"--");i++) envp[k++]=v[i];
 for(char **e=environ;*e&&k<500;e++) envp[k++]=*e; envp[k]=0; i++;
 struct timespec a,b; double best=1e18, tot=0; 
 for(int r=0;r<n;r++){ pid_t p; clock_gettime(CLOCK_MONOTONIC,&a); if(posix_spawn(&p,v[i],NULL,NULL,v+i,envp)) return 1; int st; waitpid(p,&st,0); clock_gettime(CLOCK_MONOTONIC,&b);
  double t=((b.tv_sec-a.tv_sec)*1e9+(b.tv_nsec-a.tv_nsec))/1e3; tot+=t; if(t<best)best=t;}
 printf("mean %.0f us  min %.0f us\n", tot/n, best); }
