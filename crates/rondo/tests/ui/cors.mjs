// A cross-origin fetch through the router's `cors` filter in headless Chromium (playwright-core),
// run by tests/router/traffic_cors.rs. Environment: PAGE_URL (a page on one origin), API_URL
// (the API on another), CHROMIUM, PLAYWRIGHT_DIR. Prints "ok" and exits 0 when every check
// passes.
import { createRequire } from "node:module";
import path from "node:path";

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const pageUrl = env("PAGE_URL");
const apiUrl = env("API_URL");
const require = createRequire(path.join(env("PLAYWRIGHT_DIR"), "package.json"));
const { chromium } = require("playwright-core");

const overall = setTimeout(() => {
  console.error("cors test: no result within 60 s");
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
  // Every request the browser makes, preflights included.
  const sent = [];
  page.on("request", (r) => sent.push(`${r.method()} ${r.url()}`));
  const resp = await page.goto(pageUrl, { waitUntil: "load" });
  check(resp.ok(), `GET ${pageUrl} answered ${resp.status()}`);
  check((await page.title()) === "cors page", "the page is served");

  // PUT with a JSON body and credentials: not simple, so the browser preflights it.
  const put = await page.evaluate(async (url) => {
    const r = await fetch(url, {
      method: "PUT",
      credentials: "include",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ n: 1 }),
    });
    return {
      status: r.status,
      body: await r.text(),
      id: r.headers.get("x-request-id"),
      hidden: r.headers.get("x-hidden"),
    };
  }, apiUrl);
  check(put.status === 200, `PUT answered ${put.status}`);
  check(put.body.startsWith("m1 "), `the member answered: ${put.body}`);
  check(put.id && put.id.length === 36, `x-request-id is exposed: ${put.id}`);
  check(put.hidden === null, `x-hidden is not exposed: ${put.hidden}`);

  // DELETE is not allowed: the preflight is refused and the request never leaves the browser.
  const del = await page.evaluate(async (url) => {
    try {
      await fetch(url, { method: "DELETE", credentials: "include" });
      return "sent";
    } catch (e) {
      return `refused: ${e.name}`;
    }
  }, apiUrl);
  check(del === "refused: TypeError", `DELETE: ${del}`);
  console.error(`requests: ${JSON.stringify(sent)}`);
} catch (e) {
  failed = true;
  console.error(String(e && e.stack || e));
} finally {
  await browser.close();
  clearTimeout(overall);
}
if (!failed) console.log("ok");
process.exit(failed ? 1 : 0);
