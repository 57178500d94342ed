// nats_bench.js -- the Node side of bench/run_nats.sh, on the `nats`
// package (nats.js, installed into bench/node/node_modules by the script);
// the same work as bench/nats_bench.lua.
//   node bench/node/nats_bench.js MODE URL WARMUP DURATION SIZE INFLIGHT
// pub: publish SIZE-byte messages to bench.pub, 4096 at a time, each
//      batch followed by a flush (a PING/PONG round trip);
// req: requests to bench.req, INFLIGHT at a time (async loops sharing one
//      connection), each awaiting its reply;
// serve: answer bench.req with the request's data.
// pub and req run WARMUP seconds, then DURATION seconds measured, and
// print "ops=N ticks=T hz=H secs=S p99_us=P": T is this process's
// utime+stime over the measured part, from /proc/self/stat, in clock
// ticks of H a second (H from getconf CLK_TCK, passed as HZ).
const fs = require('fs');
const { connect } = require('nats');
const [mode, url, warmupArg, durationArg, sizeArg, inflightArg] = process.argv.slice(2);
const warmup = Number(warmupArg || 2), duration = Number(durationArg || 10);
const data = new Uint8Array(Number(sizeArg || 16)).fill(120);
const inflight = Number(inflightArg || 1);
const hz = Number(process.env.HZ || 100);

function ticks() {
  const stat = fs.readFileSync('/proc/self/stat', 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return Number(f[11]) + Number(f[12]);            // fields 14, 15
}
const now = () => Number(process.hrtime.bigint()) / 1e9;

(async () => {
  const nc = await connect({ servers: url, name: 'bench-node-' + mode });
  if (mode === 'serve') {
    nc.subscribe('bench.req', { callback: (err, m) => { if (!err) m.respond(m.data); } });
    await nc.flush();
    console.log('serving');
    return;
  }
  const lat = [];
  async function pubFor(secs) {
    let n = 0;
    const stop = now() + secs;
    while (now() < stop) {
      for (let i = 0; i < 4096; i++) nc.publish('bench.pub', data);
      n += 4096;
      await nc.flush();
    }
    return n;
  }
  async function reqFor(secs, record) {
    let n = 0;
    const stop = now() + secs;
    const workers = [];
    for (let w = 0; w < inflight; w++) {
      workers.push((async () => {
        while (now() < stop) {
          const t0 = now();
          await nc.request('bench.req', data, { timeout: 5000 });
          n++;
          if (record) lat.push(now() - t0);
        }
      })());
    }
    await Promise.all(workers);
    return n;
  }
  const work = mode === 'pub' ? pubFor : reqFor;
  await work(warmup, false);
  const t0 = ticks(), w0 = now();
  const n = await work(duration, true);
  const t1 = ticks(), w1 = now();
  await nc.close();
  let p99 = 0;
  if (lat.length > 0) {
    lat.sort((a, b) => a - b);
    p99 = lat[Math.max(0, Math.floor(lat.length * 0.99) - 1)] * 1e6;
  }
  console.log(`ops=${n} ticks=${t1 - t0} hz=${hz} secs=${(w1 - w0).toFixed(3)} p99_us=${p99.toFixed(0)}`);
})();
