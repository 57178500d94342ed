// nats_bench.js -- the Node side of bench/run_nats.sh, on the `nats`
// package (nats.js, installed into bench/node/node_modules by the script).
//   node bench/node/nats_bench.js pub URL SECONDS SIZE   publish for SECONDS
//   node bench/node/nats_bench.js req URL SECONDS SIZE   requests, one at a time
//   node bench/node/nats_bench.js serve URL              answer bench.req
// pub and req print "ops=N secs=S" (S: wall time of the measured part);
// the script reads the process's CPU time from /proc/PID/stat itself.
const { connect } = require('nats');
const [mode, url, secsArg, sizeArg] = process.argv.slice(2);
const secs = Number(secsArg || 5);
const data = new Uint8Array(Number(sizeArg || 16)).fill(120);

(async () => {
  const nc = await connect({ servers: url });
  if (mode === 'serve') {
    nc.subscribe('bench.req', { callback: (err, m) => { if (!err) m.respond(m.data); } });
    await nc.flush();
    console.log('serving');
    return;
  }
  // signal readiness, then wait for a byte on stdin to start (the script
  // samples CPU time around the run)
  let n = 0;
  const t0 = process.hrtime.bigint();
  const end = t0 + BigInt(Math.round(secs * 1e9));
  if (mode === 'pub') {
    while (process.hrtime.bigint() < end) {
      for (let i = 0; i < 4096; i++) nc.publish('bench.pub', data);
      n += 4096;
      await nc.flush();
    }
  } else if (mode === 'req') {
    while (process.hrtime.bigint() < end) {
      await nc.request('bench.req', data, { timeout: 5000 });
      n++;
    }
  }
  const t = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(`ops=${n} secs=${t.toFixed(3)}`);
  await nc.close();
})();
