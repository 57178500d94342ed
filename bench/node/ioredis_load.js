// bench/node/ioredis_load.js -- the load of bench/redis_client.lua with
// ioredis, for bench/run_redis_client.sh: `clients` async loops on one
// ioredis client (one connection, as ioredis keeps), each sending
// pipelines of `pipeline` commands (SET and GET in turn), for `seconds`
// after `warmup`. Prints "ops N seconds S cpu_ticks T" for the measured
// part (T: the process's user+system CPU in 1/100 s, from process.cpuUsage).
//   node bench/node/ioredis_load.js PORT [clients] [pipeline] [seconds] [warmup] [keys] [size]
const Redis = require("ioredis");
const [port, clients = 50, depth = 16, seconds = 10, warmup = 2, keys = 100000, size = 3] =
  process.argv.slice(2).map(Number);
const r = new Redis({ port, host: "127.0.0.1", enableAutoPipelining: false });
const value = "x".repeat(size);
const names = [];
for (let i = 1; i <= keys; i++) names.push("key:" + i);
let running = true, counting = false, ops = 0;

async function worker(id) {
  let k = id;
  while (running) {
    const p = r.pipeline();
    for (let i = 0; i < depth; i += 2) {
      k = (k % keys) + 1;
      p.set(names[k - 1], value);
      p.get(names[k - 1]);
    }
    const res = await p.exec();
    for (const [err] of res) if (err) throw err;
    if (counting) ops += depth;
  }
}

(async () => {
  await r.ping();
  const all = [];
  for (let i = 1; i <= clients; i++) all.push(worker(i * 7919));
  await new Promise((ok) => setTimeout(ok, warmup * 1000));
  counting = true;
  const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
  await new Promise((ok) => setTimeout(ok, seconds * 1000));
  counting = false;
  const c1 = process.cpuUsage(c0), t = Number(process.hrtime.bigint() - t0) / 1e9;
  running = false;
  await Promise.all(all);
  const ticks = Math.round((c1.user + c1.system) / 1e4);
  console.log(`ops ${ops} seconds ${t.toFixed(3)} cpu_ticks ${ticks}`);
  r.disconnect();
})();
