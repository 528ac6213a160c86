const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');
if (isMainThread) {
  let done = 0, total = 0;
  for (let w = 0; w < 3; w++) {
    const wk = new Worker(__filename, { workerData: w });
    wk.on('message', (m) => { total += m; if (++done === 3) console.log(total); });
  }
} else {
  const m = new Map(); for (let i = 0; i < 300000; i++) m.set('k' + (i * 7 + workerData), { a: i, b: 'x'.repeat(i % 50) });
  let s = 0; for (const [k, v] of m) s += v.b.length + k.length; parentPort.postMessage(s);
}
