// A proxyless Node client (@grpc/grpc-js with @grpc/grpc-js-xds) of xds:///CLUSTER for
// crates/rondo/tests/xds.rs, bootstrapped by GRPC_XDS_BOOTSTRAP_CONFIG, driven by stdin lines
// with the same answers as peer.py's client (one JSON line each):
//   calls N        N calls one after the other: {"counts": {member: n}, "errors": {code: n}}
//   wait MEMBER S  calls until MEMBER answers one, at most S seconds: {"ok": true|false}
//   quit
// Every call has a 5 s deadline. Modules from NODE_PATH (target/xds-node/node_modules).
"use strict";
const grpc = require("@grpc/grpc-js");
require("@grpc/grpc-js-xds").register();
const readline = require("node:readline");

const client = new grpc.Client("xds:///" + process.argv[2], grpc.credentials.createInsecure());
const id = (b) => b;

function one() {
  return new Promise((resolve) => {
    const deadline = new Date(Date.now() + 5000);
    client.makeUnaryRequest("/test.Echo/Say", id, id, Buffer.alloc(0), { deadline },
      (err, reply) => resolve(err ? { err: grpc.status[err.code] || String(err.code) }
                                  : { member: reply.toString() }));
  });
}

async function handle(cmd, args) {
  const out = { counts: {}, errors: {} };
  if (cmd === "calls") {
    for (let i = 0; i < Number(args[0]); i++) {
      const r = await one();
      if (r.err) out.errors[r.err] = (out.errors[r.err] || 0) + 1;
      else out.counts[r.member] = (out.counts[r.member] || 0) + 1;
    }
  } else if (cmd === "wait") {
    const end = Date.now() + Number(args[1]) * 1000;
    out.ok = false;
    while (Date.now() < end) {
      const r = await one();
      if (r.member === args[0]) { out.ok = true; break; }
      await new Promise((res) => setTimeout(res, 5));
    }
  }
  return out;
}

(async () => {
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    const [cmd, ...args] = line.trim().split(/\s+/);
    if (!cmd) continue;
    if (cmd === "quit") break;
    process.stdout.write(JSON.stringify(await handle(cmd, args)) + "\n");
  }
  client.close();
  process.exit(0);
})();
