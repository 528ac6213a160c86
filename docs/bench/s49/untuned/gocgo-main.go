package main

/*
#include <stdlib.h>
#include <string.h>
static unsigned long fill(int n) {
    unsigned long s = 0;
    char **v = malloc(n * sizeof(char*));
    for (int i = 0; i < n; i++) { v[i] = malloc(4000); memset(v[i], 'a' + i % 26, 4000); }
    for (int i = 0; i < n; i++) { s += (unsigned char)v[i][i % 4000]; free(v[i]); }
    free(v);
    return s;
}
*/
import "C"
import (
	"crypto/md5"
	"fmt"
	"sort"
)

func main() {
	m := map[string][]int{}
	for i := 0; i < 300000; i++ {
		k := fmt.Sprintf("k%d", i%50000)
		m[k] = append(m[k], i)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := md5.New()
	for _, k := range keys {
		fmt.Fprint(h, k, m[k])
	}
	fmt.Printf("%x %d\n", h.Sum(nil), C.fill(20000))
}
