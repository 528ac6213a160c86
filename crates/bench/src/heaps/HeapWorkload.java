// zmem bench heaps: a JVM heap holding real data (run by the benchmark; see mod.rs).
// args: CORPUS_DIR SCALE. Prints the ready line, then holds its data until stdin closes.
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public class HeapWorkload {
    record Person(int id, String name, String email, double score, int visits, List<String> tags, String bio) {}

    static Object[] hold;

    static String read(String dir, String name) throws Exception {
        return new String(Files.readAllBytes(Path.of(dir, name)), StandardCharsets.ISO_8859_1);
    }

    public static void main(String[] args) throws Exception {
        String corpus = args[0];
        double scale = Double.parseDouble(args[1]);
        String text = read(corpus, "dickens");
        List<String> words = new ArrayList<>();
        Matcher m = Pattern.compile("[A-Za-z']+").matcher(text);
        int maxWords = (int) (600000 * scale);
        while (m.find() && words.size() < maxWords) words.add(m.group());
        Map<String, Integer> counts = new HashMap<>();
        for (String w : words) counts.merge(w.toLowerCase(), 1, Integer::sum);
        String[] split = text.split("(?<=[.!?])\\s+");
        List<String> sentences = new ArrayList<>();
        for (int i = 0; i < split.length && i < (int) (150000 * scale); i++) sentences.add(split[i]);
        List<String> vocabulary = new ArrayList<>(counts.keySet());
        Random rng = new Random(1);
        List<Person> people = new ArrayList<>();
        for (int i = 0; i < (int) (150000 * scale); i++) {
            String bio = sentences.get(rng.nextInt(sentences.size()));
            people.add(new Person(i,
                    vocabulary.get(rng.nextInt(vocabulary.size())),
                    vocabulary.get(rng.nextInt(vocabulary.size())) + i + "@example.org",
                    rng.nextDouble() * 100.0, rng.nextInt(10000),
                    List.of(vocabulary.get(rng.nextInt(2000)), vocabulary.get(rng.nextInt(2000)),
                            vocabulary.get(rng.nextInt(2000))),
                    bio.substring(0, Math.min(160, bio.length()))));
        }
        String xml = read(corpus, "xml");
        List<String> elements = new ArrayList<>();
        Matcher e = Pattern.compile("<[^>]+>[^<]*").matcher(xml);
        while (e.find()) elements.add(e.group());
        String samba = read(corpus, "samba");
        String[] source = samba.substring(0, Math.min(samba.length(), (int) (6000000 * scale))).split("\n");
        Map<String, List<Integer>> index = new HashMap<>();
        for (int n = 0; n < source.length; n++) {
            String[] tokens = source[n].trim().split("\\s+");
            for (int t = 0; t < tokens.length && t < 4; t++)
                index.computeIfAbsent(tokens[t], k -> new ArrayList<>()).add(n);
        }
        hold = new Object[] {words, counts, sentences, people, elements, source, index};
        System.out.println("zmem-heap-ready " + people.size() + " " + index.size());
        System.out.flush();
        while (System.in.read() >= 0) {}
    }
}
