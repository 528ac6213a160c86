/* A statically linked program (LD_PRELOAD cannot reach it): exec'd from under zmem. */
#include <stdio.h>
int main(void) {
    puts("static ok");
    return 0;
}
