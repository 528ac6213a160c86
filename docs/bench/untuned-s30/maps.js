const m = new Map(); let x = 7;
for (let i = 0; i < 300000; i++) { x = (x * 1103515245 + 12345) % 2147483648; m.set('k' + x, { i, s: 'v'.repeat(i % 50), a: [i, x, i ^ x] }); }
const keys = [...m.keys()].sort(); let h = 0;
for (const k of keys) { const v = m.get(k); h = (h * 31 + v.i + v.s.length + v.a[2]) % 1000000007; }
console.log(keys.length, h, JSON.stringify([...m.values()].slice(0, 1000)).length);
