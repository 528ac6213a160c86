// A JVM holding 2000 arrays of 25k ints, summed twice (the JVM maps its own heap).
public class H {
    public static void main(String[] a) {
        int[][] arrs = new int[2000][];
        for (int i = 0; i < arrs.length; i++) {
            arrs[i] = new int[25000];
            for (int j = 0; j < arrs[i].length; j++) arrs[i][j] = i * 31 + j;
        }
        long s = 0;
        for (int r = 0; r < 2; r++)
            for (int[] x : arrs) for (int v : x) s += v;
        System.out.println("sum " + s);
    }
}
