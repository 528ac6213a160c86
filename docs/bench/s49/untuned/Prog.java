import java.util.*;
import java.util.concurrent.*;
public class Prog {
  public static void main(String[] a) throws Exception {
    Map<String, List<Integer>> m = new HashMap<>();
    for (int i = 0; i < 600000; i++) m.computeIfAbsent("k" + (i % 90000), k -> new ArrayList<>()).add(i);
    List<String> keys = new ArrayList<>(m.keySet()); Collections.sort(keys);
    long h = 0; for (String k : keys) for (int v : m.get(k)) h = (h * 31 + v + k.hashCode()) % 1000000007L;
    ExecutorService ex = Executors.newFixedThreadPool(4);
    List<Future<Long>> fs = new ArrayList<>();
    for (int t = 0; t < 4; t++) { final int tt = t; fs.add(ex.submit(() -> { long s = 0; int[] arr = new int[3000000]; for (int i = 0; i < arr.length; i++) arr[i] = i * tt; Arrays.sort(arr); for (int x : arr) s += x; return s; })); }
    long s = 0; for (Future<Long> f : fs) s += f.get(); ex.shutdown();
    System.out.println(h + " " + s);
  }
}
