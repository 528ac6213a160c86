package main

/*
#include <stdlib.h>
static void* grab(int n) { return malloc(n); }
*/
import "C"
import ("fmt"; "sync")

func main() {
	var wg sync.WaitGroup
	res := make([]int, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var keep [][]byte
			s := 0
			for r := 0; r < 60; r++ {
				b := make([]byte, 1<<20)
				for i := range b { b[i] = byte(i + r) }
				keep = append(keep, b)
				if len(keep) > 20 { keep = keep[1:] }
				for _, k := range keep { s += int(k[r*997%len(k)]) }
				C.grab(C.int(64 << 10))
			}
			res[g] = s
		}(g)
	}
	wg.Wait()
	fmt.Println(res)
}
