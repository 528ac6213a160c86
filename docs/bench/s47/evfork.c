// Cost of UFFD_FEATURE_EVENT_FORK alone: fork+_exit+waitpid with a uffd-registered heap and a
// handler thread that reads FORK events (and closes the child's fd), vs no uffd.
#define _GNU_SOURCE
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <poll.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static int uffd = -1;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static void *handler(void *a){
  struct pollfd p={uffd,POLLIN,0};
  for(;;){ if(poll(&p,1,-1)<0) continue; struct uffd_msg m; if(read(uffd,&m,sizeof m)!=sizeof m) continue;
    if(m.event==UFFD_EVENT_FORK) close(m.arg.fork.ufd); }
  return 0;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  int mode=atoi(argv[1]); int n=atoi(argv[2]); size_t heap=(size_t)atoi(argv[3])<<20;
  size_t len=1UL<<30; char *r=mmap(0,len,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0);
  memset(r,1,heap);
  if(mode){ uffd=syscall(SYS_userfaultfd,O_CLOEXEC|O_NONBLOCK|UFFD_USER_MODE_ONLY);
    struct uffdio_api api={.api=UFFD_API,.features=UFFD_FEATURE_EVENT_FORK|(mode==2?UFFD_FEATURE_SIGBUS:0)};
    if(ioctl(uffd,UFFDIO_API,&api)){perror("api");return 1;}
    struct uffdio_register reg={.range={(unsigned long)r,len},.mode=UFFDIO_REGISTER_MODE_MISSING};
    if(ioctl(uffd,UFFDIO_REGISTER,&reg)){perror("reg");return 1;}
    pthread_t t; pthread_create(&t,0,handler,0);}
  double *f=malloc(n*sizeof(double)),*rd=malloc(n*sizeof(double));
  for(int i=0;i<n;i++){ double a=now(); pid_t p=fork(); if(!p) _exit(0); double b=now(); waitpid(p,0,0); double c=now(); f[i]=b-a; rd[i]=c-a; usleep(1000);}
  qsort(f,n,8,cmp); qsort(rd,n,8,cmp);
  printf("mode %d: fork %.0f us, round %.0f us (medians)\n",mode,f[n/2],rd[n/2]);}
