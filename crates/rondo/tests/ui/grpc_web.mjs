// gRPC-Web calls from headless Chromium (playwright-core) with the grpc-web npm library, whose
// ES module bundle the router serves at /grpc-web.js; run by tests/router/grpc_web.rs.
// Environment: PAGE_URL (the page, on the router), CHROMIUM, PLAYWRIGHT_DIR. Prints "ok" and
// exits 0 when every check passes.
import { createRequire } from "node:module";
import path from "node:path";

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const pageUrl = env("PAGE_URL");
const require = createRequire(path.join(env("PLAYWRIGHT_DIR"), "package.json"));
const { chromium } = require("playwright-core");

const overall = setTimeout(() => {
  console.error("grpc-web test: no result within 60 s");
  process.exit(2);
}, 60_000);

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

const browser = await chromium.launch({
  executablePath: env("CHROMIUM"),
  timeout: 30_000,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"],
});
let failed = false;
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(15_000);
  const resp = await page.goto(pageUrl, { waitUntil: "load" });
  check(resp.ok(), `GET ${pageUrl} answered ${resp.status()}`);
  check((await page.title()) === "grpc-web page", "the page is served");

  // Messages are raw bytes (no generated code): the member echoes or names itself.
  const got = await page.evaluate(async () => {
    const gw = await import("/grpc-web.js");
    const enc = (s) => new TextEncoder().encode(s);
    const dec = (b) => new TextDecoder().decode(b);
    const same = (b) => b;
    const unary = (name) =>
      new gw.MethodDescriptor(name, gw.MethodType.UNARY, Object, Object, same, same);
    const out = {};
    for (const format of ["text", "binary"]) {
      const client = new gw.GrpcWebClientBase({ format });
      const reply = await client.unaryCall(
        `${location.origin}/test.Echo/Echo`, enc(`from ${format}`), {}, unary("/test.Echo/Echo"));
      out[format] = dec(reply);
    }
    const client = new gw.GrpcWebClientBase({ format: "text" });
    const many = new gw.MethodDescriptor(
      "/test.Echo/Many", gw.MethodType.SERVER_STREAMING, Object, Object, same, same);
    out.stream = await new Promise((resolve, reject) => {
      const messages = [];
      const stream = client.serverStreaming(
        `${location.origin}/test.Echo/Many`, enc("x"), {}, many);
      stream.on("data", (m) => messages.push(dec(m)));
      stream.on("error", (e) => reject(new Error(`stream: ${e.code} ${e.message}`)));
      stream.on("end", () => resolve(messages));
    });
    const failure = async (name) => {
      try {
        await client.unaryCall(`${location.origin}${name}`, enc("eve"), {}, unary(name));
        return "no error";
      } catch (e) {
        return `${e.code} ${e.message}`;
      }
    };
    out.denied = await failure("/test.Echo/Deny");
    out.dead = await failure("/dead.Echo/Echo");
    return out;
  });
  check(got.text === "m1:from text", `text call: ${got.text}`);
  check(got.binary === "m1:from binary", `binary call: ${got.binary}`);
  check(JSON.stringify(got.stream) === JSON.stringify(["m1:0", "m1:1", "m1:2", "m1:3", "m1:4"]),
        `stream: ${JSON.stringify(got.stream)}`);
  check(got.denied.startsWith("7 ") && got.denied.includes("no entry for eve"),
        `a member's error: ${got.denied}`);
  check(got.dead.startsWith("14 "), `the router's own error: ${got.dead}`);
  console.log("ok");
} catch (e) {
  failed = true;
  console.error(e.stack || String(e));
} finally {
  clearTimeout(overall);
  await browser.close();
}
process.exit(failed ? 1 : 0);
