// MCP Inspector's web UI, in its default (earlier-era) mode, driven in headless Chromium with playwright-core.
//
//   node inspector_ui.mjs INSPECTOR_URL SCREENSHOT_DIR CHROMIUM [STEPS]
//
// INSPECTOR_URL is the address the Inspector printed (with MCP_INSPECTOR_API_TOKEN); its one server is
// a deployment of tests.apps.interop_app. It connects, calls `count_up` (recording every "Tool progress"
// notice while the call is pending), then `ask_name` (answering the "Elicitation Request" form), and
// prints one JSON line of what it saw; screenshots go to SCREENSHOT_DIR. Every wait is bounded, and a
// watchdog ends the program whatever happens.

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

const [url, shots, executablePath, stepsArg = "3"] = process.argv.slice(2);
const steps = Number(stepsArg);
const report = { ok: false, shots: [] };
const LIMIT_MS = 150_000;

function finish(code) {
  process.stdout.write(JSON.stringify(report) + "\n");
  process.exit(code);
}

const watchdog = setTimeout(() => {
  report.error = `watchdog: no end after ${LIMIT_MS} ms (last step: ${report.step})`;
  finish(1);
}, LIMIT_MS);

function loopback(address) {
  const { protocol, hostname } = new URL(address);
  return !/^https?:$/.test(protocol) || ["127.0.0.1", "localhost", "[::1]"].includes(hostname);
}

async function shot(page, name) {
  // Let CSS transitions (the dialog's fade-in) end first; the busy button's spinner is an endless animation.
  await page.evaluate(() =>
    Promise.all(document.getAnimations().filter((a) => a instanceof CSSTransition).map((a) => a.finished.catch(() => {}))),
  );
  const file = path.join(shots, `${name}.png`);
  await page.screenshot({ path: file });
  report.shots.push(file);
}


async function openTool(page, name) {
  await page.getByText(name, { exact: true }).first().click();
  await page.getByRole("button", { name: "Execute Tool" }).waitFor();
}

const profile = fs.mkdtempSync(path.join(os.tmpdir(), "inspector-ui-chromium-"));
let context;
try {
  report.step = "launch";
  context = await chromium.launchPersistentContext(profile, {
    executablePath,
    headless: true,
    viewport: { width: 1600, height: 1000 },
    timeout: 30_000,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  // Offline: the page asks for web fonts; everything it needs is on loopback.
  await context.route("**/*", (route) => (loopback(route.request().url()) ? route.continue() : route.abort()));
  const page = context.pages()[0] ?? (await context.newPage());
  page.setDefaultTimeout(20_000);

  report.step = "connect";
  await page.goto(url);
  // A click, not check(): the switch turns on once the connection is made, not at the click, and check() fails
  // when the state has not changed right after it (a loaded machine). The server card's era line waits for it.
  await page.getByRole("switch", { name: /Connect or disconnect/ }).click({ force: true }); // Mantine hides the input
  report.protocol = await page.getByText(/^MCP \d{4}-\d{2}-\d{2}$/).first().innerText(); // on the server card
  const badge = page.getByText(/^legacy$/i); // the Messages list's era mark ("Legacy", shown upper-case)
  report.messagesBadge = await badge.waitFor().then(
    () => true,
    () => false,
  );
  await shot(page, "1-connected");

  report.step = "count_up";
  await page.locator("label", { hasText: /^Tools$/ }).click(); // the header's segmented control
  await openTool(page, "count_up");
  await page.getByRole("textbox", { name: "Steps" }).fill(String(steps));
  await page.getByRole("textbox", { name: "Pause" }).fill("1");
  // Every text a notice takes is recorded in the page as the DOM changes (a MutationObserver), so a slow
  // sampling loop on a loaded machine cannot miss a step that was on screen for only a moment.
  await page.evaluate(() => {
    window.__progressWhilePending = [];
    const record = () => {
      const pending = [...document.querySelectorAll("button")].some((b) => b.textContent.trim() === "Cancel");
      if (!pending) return;
      for (const alert of document.querySelectorAll('[role="alert"]')) {
        const text = alert.innerText.trim();
        if (text.includes("Tool progress") && !window.__progressWhilePending.includes(text)) {
          window.__progressWhilePending.push(text);
        }
      }
    };
    new MutationObserver(record).observe(document.body, { subtree: true, childList: true, characterData: true });
  });
  await page.getByRole("button", { name: "Execute Tool" }).click();
  const counted = page.getByText(`counted to ${steps}`, { exact: true });
  await page.waitForFunction(() => window.__progressWhilePending.length >= 2, null, { timeout: 60_000 }).then(
    () => shot(page, "2-count_up-progress-while-pending"),
    () => {},
  );
  await counted.waitFor({ timeout: 60_000 });
  const whilePending = await page.evaluate(() => window.__progressWhilePending);
  report.progressWhilePending = whilePending;
  report.pendingCallSeen = whilePending.length > 0;
  await counted.waitFor({ timeout: 5_000 });
  report.countUpResult = await counted.innerText();
  await shot(page, "3-count_up-result");

  report.step = "ask_name";
  await openTool(page, "ask_name");
  await page.getByRole("textbox", { name: "Greeting" }).fill("Hello");
  await page.getByRole("button", { name: "Execute Tool" }).click();
  const dialog = page.getByRole("dialog", { name: "Elicitation Request" });
  await dialog.waitFor({ timeout: 30_000 });
  report.dialogText = await dialog.innerText();
  const field = dialog.getByRole("textbox", { name: "name" });
  report.formField = await field.isVisible();
  await shot(page, "4-ask_name-form");
  await field.fill("Ada");
  await dialog.getByRole("button", { name: "Submit" }).click();
  await dialog.waitFor({ state: "hidden" });
  const greeted = page.getByText("Hello, Ada!", { exact: true });
  await greeted.waitFor({ timeout: 30_000 });
  report.askNameResult = await greeted.innerText();
  await shot(page, "5-ask_name-result");

  report.step = "done";
  report.ok = true;
} catch (error) {
  report.error = String(error?.stack ?? error);
  const page = context?.pages()[0];
  if (page) await shot(page, "failure").catch(() => {});
} finally {
  await context?.close().catch(() => {});
  fs.rmSync(profile, { recursive: true, force: true });
  clearTimeout(watchdog);
}
finish(report.ok ? 0 : 1);
