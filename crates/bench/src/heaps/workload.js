// zmem bench heaps: a V8 heap holding real data (run by the benchmark; see mod.rs).
// argv: CORPUS_DIR SCALE. Prints the ready line, then holds its data until stdin closes.
'use strict';
const fs = require('fs');
const path = require('path');

const [corpus, scaleArg] = process.argv.slice(2);
const scale = Number(scaleArg);
const read = (name) => fs.readFileSync(path.join(corpus, name), 'latin1');

// A small deterministic generator (mulberry32), so every run holds the same data.
let seed = 1;
const rand = () => {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const pick = (a) => a[Math.floor(rand() * a.length)];

const text = read('dickens');
const words = (text.match(/[A-Za-z']+/g) || []).slice(0, Math.floor(600000 * scale));
const counts = new Map();
for (const w of words) {
  const k = w.toLowerCase();
  counts.set(k, (counts.get(k) || 0) + 1);
}
const sentences = text.split(/(?<=[.!?])\s+/).slice(0, Math.floor(150000 * scale));
const vocabulary = [...counts.keys()];
const records = [];
for (let i = 0; i < Math.floor(150000 * scale); i++) {
  records.push({
    id: i,
    name: pick(vocabulary),
    email: `${pick(vocabulary)}${i}@example.org`,
    score: rand() * 100,
    visits: Math.floor(rand() * 10000),
    tags: [pick(vocabulary), pick(vocabulary), pick(vocabulary)],
    bio: pick(sentences).slice(0, 160),
  });
}
const parsed = JSON.parse(JSON.stringify(records.slice(0, records.length >> 2)));
const xml = read('xml');
const elements = xml.match(/<[^>]+>[^<]*/g) || [];
const source = read('samba').slice(0, Math.floor(6000000 * scale)).split('\n');
const index = new Map();
source.forEach((line, n) => {
  for (const token of line.split(/\s+/).slice(0, 4)) {
    if (!index.has(token)) index.set(token, []);
    index.get(token).push(n);
  }
});
globalThis.hold = [words, counts, sentences, records, parsed, elements, source, index];
console.log('zmem-heap-ready', records.length, index.size);
process.stdin.resume();
process.stdin.on('end', () => process.exit(0));
