# zmem bench heaps: a Python heap holding real data (run by the benchmark; see mod.rs).
# argv: CORPUS_DIR SCALE. Prints the ready line, then holds its data until stdin closes.
import collections
import io
import json
import os
import random
import re
import sys
import tarfile
import xml.etree.ElementTree as ET

corpus, scale = sys.argv[1], float(sys.argv[2])


def read(name):
    with open(os.path.join(corpus, name), "rb") as f:
        return f.read()


text = read("dickens").decode("latin-1")
words = re.findall(r"[A-Za-z']+", text)[: int(600_000 * scale)]
counts = collections.Counter(w.lower() for w in words)
sentences = re.split(r"(?<=[.!?])\s+", text)[: int(150_000 * scale)]
# silesia's xml is a tar of 21 documents: each parsed into an element tree.
with tarfile.open(fileobj=io.BytesIO(read("xml"))) as tar:
    documents = []
    for member in tar.getmembers():
        if member.isfile():
            try:
                documents.append(ET.fromstring(tar.extractfile(member).read()))
            except ET.ParseError:
                pass
rng = random.Random(1)
vocabulary = list(counts)
records = [
    {
        "id": i,
        "name": rng.choice(vocabulary).title(),
        "email": f"{rng.choice(vocabulary)}{i}@example.org",
        "score": rng.random() * 100.0,
        "visits": rng.randrange(1, 10_000),
        "tags": rng.sample(vocabulary[:2000], 3),
        "bio": rng.choice(sentences)[:160],
    }
    for i in range(int(150_000 * scale))
]
parsed = json.loads(json.dumps(records[: len(records) // 4]))
source = read("samba")[: int(6_000_000 * scale)].decode("latin-1").splitlines()
index = collections.defaultdict(list)
for n, line in enumerate(source):
    for token in line.split()[:4]:
        index[token].append(n)
hold = (words, counts, sentences, documents, records, parsed, source, index)
print("zmem-heap-ready", len(records), len(documents), len(index), flush=True)
sys.stdin.read()
