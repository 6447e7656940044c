// Drives the dashboard in headless Chromium (playwright-core), run by tests/dashboard.rs.
// Environment: DASHBOARD_URL, TOKEN, CLUSTER, MEMBERS (comma-separated), DRAIN (a member),
// SHADOW (an algorithm to start as the cluster's shadow), IDLE_CLUSTER (a cluster with health
// checks that gets no traffic) and IDLE_MEMBERS, SCREENSHOT (a .png path), CHROMIUM (the
// browser), PLAYWRIGHT_DIR (where node_modules/playwright-core is). Prints "ok" and exits 0 when
// every check passes.
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
const idleCluster = env("IDLE_CLUSTER");
const idleMembers = env("IDLE_MEMBERS").split(",");
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
  await tokenLink();
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

  // No member has a load agent: the agent columns are hidden, header and cells.
  const display = (sel) => page.$$eval(sel, (els) => els.map((e) => getComputedStyle(e).display));
  for (const col of ["cpu", "mem", "age"]) {
    const shown = await display(`${table} > table :is(th, td).${col}`);
    check(shown.length === members.length + 1 && shown.every((d) => d === "none"),
          `${col} column hidden: ${shown}`);
  }
  const ewmaShown = await display(`${table} > table :is(th, td).ewma`);
  check(ewmaShown.length === members.length + 1 && ewmaShown.every((d) => d !== "none"),
        `the EWMA column shows: ${ewmaShown}`);

  // A cluster that got no request: no EWMA to show yet (not the configured default), and its
  // health rests on the checks that answered, with their round trips and ranks beside it.
  const idle = `section[data-cluster="${idleCluster}"]`;
  const cell = (sel, m, k) => `${sel} tr[data-member="${m}"] td.${k}`;
  for (const m of idleMembers) {
    await page.waitForFunction((s) => document.querySelector(s)?.textContent.startsWith("up (health-check)"),
                               cell(idle, m, "health"));
    await page.waitForFunction((s) => /^\d+\.\d$/.test(document.querySelector(s).textContent),
                               cell(idle, m, "probe"));
    await page.waitForFunction((s) => /^\d$/.test(document.querySelector(s).textContent),
                               cell(idle, m, "rank"));
    const ewma = await page.textContent(cell(idle, m, "ewma"));
    check(ewma === "–", `${idleCluster}/${m} has no EWMA before any request: ${ewma}`);
  }
  const ranks = await Promise.all(idleMembers.map((m) => page.textContent(cell(idle, m, "rank"))));
  check(JSON.stringify(ranks.map(Number).sort()) === JSON.stringify(idleMembers.map((_, i) => i)),
        `ranks ${ranks}`);
  // The cluster with traffic: measured EWMAs; nothing checks its members.
  for (const m of members) {
    await page.waitForFunction((s) => /^\d+\.\d$/.test(document.querySelector(s).textContent),
                               cell(table, m, "ewma"));
    const health = await page.textContent(cell(table, m, "health"));
    check(health === "unchecked", `${m} health: ${health}`);
  }

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

  // The drained member gets no more requests: its EWMA decays, and the page says so once the
  // last sample is 3 s old; the members with traffic stay unmarked.
  await page.waitForFunction((s) => document.querySelector(s).textContent.includes("(idle "),
                             cell(table, drained, "ewma"));
  const marked = await page.textContent(cell(table, drained, "ewma"));
  check(/^\d+\.\d \(idle \d+ s, was \d+\.\d\)$/.test(marked), `decayed EWMA: ${marked}`);
  for (const m of members.filter((m) => m !== drained)) {
    const t = await page.textContent(cell(table, m, "ewma"));
    check(!t.includes("idle"), `${m} has traffic: ${t}`);
  }

  // The chart spans the panel, has time ticks, and a y axis topped at a readable step.
  const chart = await page.$eval(`${table} canvas`, (cv) => ({
    width: cv.clientWidth, panel: cv.closest("section").clientWidth,
    ymax: Number(cv.dataset.ymax), ticks: (cv.dataset.ticks || "").split(","),
  }));
  check(chart.width >= chart.panel - 40, `chart ${chart.width} px wide in a ${chart.panel} px panel`);
  check(chart.ticks[0] === "now" && chart.ticks.includes("-30 s") && chart.ticks.includes("-1 min"),
        `time ticks ${chart.ticks}`);
  const scales = await page.evaluate(() => [0, 0.4, 7.3, 18.5, 123].map((v) => yScale(v)));
  check(JSON.stringify(scales) === JSON.stringify([{ step: 0.25, top: 1 }, { step: 0.25, top: 1 },
        { step: 2, top: 8 }, { step: 5, top: 20 }, { step: 50, top: 150 }]),
        `y scales ${JSON.stringify(scales)}`);
  const readable = (v) => [1, 2, 2.5, 5].some((f) => {
    const n = v / f / Math.pow(10, Math.floor(Math.log10(v / f)));
    return Math.abs(n - Math.round(n)) < 1e-9;
  });
  check(chart.ymax >= 1 && readable(chart.ymax), `y axis top ${chart.ymax}`);

  await page.waitForTimeout(500);
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

// The link `rondo serve` and `rondo demo --serve` print: the page takes the token from the
// fragment, connects without asking, and removes the token from the address bar; the token is
// in no request's address (browsers never send a fragment).
async function tokenLink() {
  const context = await browser.newContext({ viewport: { width: 1400, height: 700 } });
  try {
    const page = await context.newPage();
    page.setDefaultTimeout(15_000);
    const urls = [];
    page.on("request", (r) => urls.push(r.url()));
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    const link = `${url}#token=${encodeURIComponent(token)}`;
    await page.goto(link, { waitUntil: "load" });
    await page.waitForSelector(`section[data-cluster="${cluster}"] tr[data-member="${members[0]}"]`);
    check(page.url() === url, `address bar after the link: ${page.url()}`);
    check(await page.evaluate(() => location.hash) === "", "fragment removed");
    check(await page.evaluate(() => sessionStorage.getItem("rondo-token")) === token,
          "token kept in sessionStorage");
    check(await page.inputValue("#token") === "", "token field stays empty");
    check(urls.length > 0 && urls.every((u) => !u.includes(token)), `request addresses ${urls}`);
    check(errors.length === 0, `no errors in the page: ${errors.join("; ")}`);
  } finally {
    await context.close();
  }
}
