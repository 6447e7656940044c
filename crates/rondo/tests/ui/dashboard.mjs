// Drives the dashboard in headless Chromium (playwright-core), run by tests/dashboard.rs.
// Environment: DASHBOARD_URL, TOKEN, CLUSTER, MEMBERS (comma-separated), DRAIN (a member),
// SHADOW (an algorithm to start as the cluster's shadow), SCREENSHOT (a .png path), CHROMIUM
// (the browser), PLAYWRIGHT_DIR (where node_modules/playwright-core is). Prints "ok" and exits 0
// when every check passes.
import { createRequire } from "node:module";
import path from "node:path";

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const url = env("DASHBOARD_URL");
const token = env("TOKEN");
const cluster = env("CLUSTER");
const members = env("MEMBERS").split(",");
const drained = env("DRAIN");
const shadow = env("SHADOW");
const queue = env("QUEUE");
const require = createRequire(path.join(env("PLAYWRIGHT_DIR"), "package.json"));
const { chromium } = require("playwright-core");

// Every wait below is bounded; this bounds the whole run.
const overall = setTimeout(() => {
  console.error("dashboard test: no result within 90 s");
  process.exit(2);
}, 90_000);

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

const browser = await chromium.launch({
  executablePath: env("CHROMIUM"),
  timeout: 30_000,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"],
});
let failed = false;
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 700 } });
  page.setDefaultTimeout(15_000);
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  page.on("console", (m) => m.type() === "error" && pageErrors.push(m.text()));

  const resp = await page.goto(url, { waitUntil: "load" });
  check(resp.ok(), `GET ${url} answered ${resp.status()}`);
  check((await page.title()) === "rondo dashboard", "page title");

  // A wrong token is refused, and the page says so.
  await page.fill("#token", "not-the-token");
  await page.click("#connect");
  await page.waitForFunction(() => document.querySelector("#error").textContent.includes("token refused"));
  pageErrors.length = 0; // the browser logs the 401 itself

  await page.fill("#token", token);
  await page.click("#connect");
  const table = `section[data-cluster="${cluster}"]`;
  for (const m of members) {
    await page.waitForSelector(`${table} tr[data-member="${m}"] td.state`);
  }
  await page.waitForFunction(() => document.querySelector("#error").textContent === "");
  const shown = await page.$$eval(`${table} > table tbody tr`, (rows) => rows.map((r) => r.dataset.member));
  check(JSON.stringify(shown) === JSON.stringify(members), `rows ${shown} are ${members}`);
  const state = `${table} tr[data-member="${drained}"] td.state`;
  check((await page.textContent(state)).startsWith("active"), "member starts active");

  // The queue table: three messages accepted and delivered.
  const q = `#queues tr[data-queue="${queue}"]`;
  await page.waitForFunction((sel) => {
    const row = document.querySelector(sel);
    return row && row.children[7].textContent === "3" && row.children[8].textContent === "3";
  }, q);
  check(await page.isVisible("#queues"), "the queue table shows");

  // Let the chart gather a few seconds of traffic.
  await page.waitForTimeout(4_000);

  // No shadow yet: its panel is hidden. Start one from the page; its report appears.
  const panel = `${table} div.shadow`;
  check(await page.isHidden(panel), "no shadow panel before a shadow is started");
  await page.selectOption(`${table} select.shadow-algorithm`, shadow);
  await page.click(`${table} button.shadow-start`);
  await page.waitForSelector(`${panel}[data-shadow="${shadow}"]`, { state: "visible" });
  for (const m of members) await page.waitForSelector(`${panel} tr[data-member="${m}"] td.live`);
  // Wait for some compared picks, then read the whole panel at once (it refreshes every second).
  await page.waitForFunction((sel) => {
    const m = document.querySelector(sel + " h3").textContent.match(/ (\d+) picks compared/);
    return m && Number(m[1]) >= 20;
  }, panel);
  const seen = await page.$eval(panel, (p) => {
    const num = (td) => Number(td.textContent);
    const rows = [...p.querySelectorAll("tbody tr")];
    return {
      title: p.querySelector("h3").textContent,
      summary: p.querySelector(".summary").textContent,
      members: rows.map((r) => r.dataset.member),
      live: rows.map((r) => num(r.querySelector("td.live"))),
      shadow: rows.map((r) => num(r.querySelector("td.shadow"))),
    };
  });
  const compared = Number(seen.title.match(/ (\d+) picks compared/)[1]);
  check(seen.title.startsWith(`shadow ${shadow} beside round-robin`), `panel title: ${seen.title}`);
  check(JSON.stringify(seen.members) === JSON.stringify(members), `shadow rows ${seen.members}`);
  const sum = (xs) => xs.reduce((a, b) => a + b, 0);
  check(sum(seen.live) === compared, `live picks ${seen.live} add up to ${compared}`);
  check(sum(seen.shadow) === compared, `shadow picks ${seen.shadow} add up to ${compared}`);
  // Round-robin live: the shares differ by at most one pick.
  check(Math.max(...seen.live) - Math.min(...seen.live) <= 1, `round-robin shares ${seen.live}`);
  check(seen.summary.startsWith("would have gone to failed members: shadow 0"), seen.summary);
  const switchText = await page.textContent(`${table} button.shadow-switch`);
  check(switchText === `Switch to ${shadow}`, `switch button: ${switchText}`);
  check(await page.isEnabled(`${table} button.shadow-switch`), "switch button enabled");

  // Then drain.
  await page.click(`${table} tr[data-member="${drained}"] button.drain`);
  await page.waitForFunction(
    (sel) => document.querySelector(sel).textContent.startsWith("draining"), state);
  const text = await page.textContent(state);
  check(text.includes("operator:dashboard"), `state cell names the dashboard: ${text}`);
  // The traffic cell says the drained member gets nothing new, and why; the others get traffic.
  const traffic = (m) => page.textContent(`${table} tr[data-member="${m}"] td.traffic`);
  await page.waitForFunction(
    (sel) => document.querySelector(sel).textContent === "no: draining",
    `${table} tr[data-member="${drained}"] td.traffic`);
  for (const m of members.filter((m) => m !== drained)) {
    const t = await traffic(m);
    check(t === "yes", `${m} gets traffic: ${t}`);
  }
  for (const m of members.filter((m) => m !== drained)) {
    const t = await page.textContent(`${table} tr[data-member="${m}"] td.state`);
    check(t.startsWith("active"), `${m} stays active: ${t}`);
  }

  // The API agrees.
  const status = await (await fetch(new URL("/api/v1/status", url), {
    headers: { Authorization: `Bearer ${token}` }, signal: AbortSignal.timeout(10_000),
  })).json();
  const m = status.clusters.find((c) => c.name === cluster).members.find((x) => x.name === drained);
  check(m.admin === "draining" && m.admin_by === "operator:dashboard",
        `status says ${m.admin} by ${m.admin_by}`);

  await page.waitForTimeout(1_500);
  await page.screenshot({ path: env("SCREENSHOT"), fullPage: true });
  check(pageErrors.length === 0, `no errors in the page: ${pageErrors.join("; ")}`);
  console.log("ok");
} catch (e) {
  failed = true;
  console.error(`dashboard test: ${e.stack || e}`);
} finally {
  await browser.close().catch(() => {});
  clearTimeout(overall);
}
process.exit(failed ? 1 : 0);
