// Real work for the seccomp allowlist test: worker threads, subprocesses
// (sync and async), file I/O in the workspace and /tmp, timers, promises,
// a Unix socket, fs.watch, JSON, hashing and the environment. Prints one
// JSON line; exits 0.
'use strict';
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');
const { execFileSync, spawn } = require('child_process');
const crypto = require('crypto');
const fs = require('fs');
const net = require('net');
const os = require('os');
const path = require('path');

if (!isMainThread) {
  const h = crypto.createHash('sha256').update(String(workerData).repeat(1000)).digest('hex');
  parentPort.postMessage(h.slice(0, 8));
  return;
}

const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

function worker(n) {
  return new Promise((res, rej) => {
    const w = new Worker(__filename, { workerData: n });
    w.once('message', res);
    w.once('error', rej);
  });
}

function child(cmd, args) {
  return new Promise((res, rej) => {
    const c = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    c.stdout.on('data', (d) => (out += d));
    c.on('error', rej);
    c.on('close', (code) => res([out.trim(), code]));
  });
}

function unixEcho(dir) {
  const sock = path.join(dir, 'echo.sock');
  return new Promise((res, rej) => {
    const srv = net.createServer((c) => c.pipe(c));
    srv.listen(sock, () => {
      const c = net.connect(sock, () => c.end('ping'));
      let got = '';
      c.on('data', (d) => (got += d));
      c.on('end', () => srv.close(() => res(got)));
      c.on('error', rej);
    });
    srv.on('error', rej);
  });
}

function watchOnce(dir) {
  return new Promise((res) => {
    const w = fs.watch(dir, () => {
      w.close();
      res(true);
    });
    setTimeout(() => fs.writeFileSync(path.join(dir, 'touched'), 'x'), 20);
  });
}

async function main() {
  const r = {};
  r.threads = await Promise.all([0, 1, 2, 3].map(worker));
  r.sh = execFileSync('/bin/sh', ['-c', 'echo sub:$((6*7))']).toString().trim();
  r.self = await child(process.execPath, ['-e', 'console.log(2 ** 10)']);
  await fs.promises.writeFile('js-out.json', JSON.stringify({ k: [1, 2, 3] }));
  r.ws = JSON.parse(await fs.promises.readFile('js-out.json', 'utf8')).k;
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'js-'));
  fs.writeFileSync(path.join(tmp, 'f'), 'tmp-ok');
  r.tmp = fs.readFileSync(path.join(tmp, 'f'), 'utf8');
  const t0 = Date.now();
  await sleep(20);
  let ticks = 0;
  await new Promise((res) => {
    const i = setInterval(() => ++ticks === 3 && (clearInterval(i), res()), 5);
  });
  r.timer = Date.now() - t0 >= 20 && ticks === 3;
  r.unix = await unixEcho(tmp);
  r.watch = await watchOnce(tmp);
  fs.rmSync(tmp, { recursive: true });
  r.env = process.env.SHAREDOS_RUNTIME_PROBE || null;
  r.random = crypto.randomBytes(16).length;
  r.sha = crypto.createHash('sha256').update('sharedos').digest('hex').slice(0, 16);
  console.log(JSON.stringify(r, Object.keys(r).sort()));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
