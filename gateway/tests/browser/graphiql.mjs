// Drives headless Chromium through the gateway's GraphiQL, offline:
//   node gateway/tests/browser/graphiql.mjs http://127.0.0.1:PORT
// Every request that is not for a loopback address is aborted and recorded.
// Opens <url>/graphql, waits for the editor, runs the query (argument 2,
// default below) with the execute button, waits for the answer, opens the
// docs and the settings dialog, and prints one JSON line:
//   {"blocked":[...],"consoleErrors":[...],"cspViolations":[...],"result":"..."}
// (plus "requests", the loopback URLs fetched). Exit 0 when it got that far,
// 1 on a failure (the line then carries "error"). Each step is bounded, and
// so is the whole run; the browser is closed on every path.
// CHROMIUM overrides the browser (default /usr/bin/chromium).
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const base = process.argv[2];
const query = process.argv[3] ?? "{ repositories(first: 5) { nodes { name } } }";
const STEP_MS = 30_000;
const RUN_MS = 90_000;

const out = { blocked: [], consoleErrors: [], cspViolations: [], requests: [], result: null };
const profile = mkdtempSync(join(tmpdir(), "fanout-graphiql-"));
let context;
let finished = false;

async function finish(code, error) {
  if (finished) return;
  finished = true;
  if (error) out.error = String(error?.stack ?? error);
  try {
    await context?.close();
  } catch {}
  rmSync(profile, { recursive: true, force: true });
  // Exit once the line is out (a pipe takes it asynchronously).
  process.stdout.write(JSON.stringify(out) + "\n", () => process.exit(code));
}

const deadline = setTimeout(() => finish(1, `the run took over ${RUN_MS} ms`), RUN_MS);
for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"]) {
  process.on(signal, () => finish(1, `stopped by ${signal}`));
}

function loopback(url) {
  try {
    const { hostname } = new URL(url);
    return hostname === "127.0.0.1" || hostname === "localhost" || hostname === "[::1]";
  } catch {
    return false;
  }
}

try {
  if (!base) throw new Error("usage: graphiql.mjs <base url>");
  context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    timeout: STEP_MS,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    ],
  });
  context.setDefaultTimeout(STEP_MS);
  // The network is cut: loopback only.
  await context.route("**", (route) => {
    const url = route.request().url();
    if (loopback(url)) {
      out.requests.push(`${route.request().method()} ${url}`);
      return route.continue();
    }
    out.blocked.push(url);
    return route.abort("blockedbyclient");
  });
  // CSP violations, as the page sees them (an init script is not subject to the page's CSP).
  await context.exposeBinding("__fanoutCspViolation", (_source, violation) => {
    out.cspViolations.push(violation);
  });
  await context.addInitScript(() => {
    document.addEventListener("securitypolicyviolation", (e) => {
      window.__fanoutCspViolation({
        directive: e.effectiveDirective,
        blocked: e.blockedURI,
        source: `${e.sourceFile}:${e.lineNumber}`,
        sample: e.sample,
      });
    });
  });

  const page = context.pages()[0] ?? (await context.newPage());
  page.on("console", (message) => {
    if (message.type() !== "error") return;
    out.consoleErrors.push(message.text());
    if (/Content Security Policy/i.test(message.text())) {
      out.cspViolations.push({ console: message.text() });
    }
  });
  page.on("pageerror", (error) => out.consoleErrors.push(`uncaught: ${error.message}`));

  // A navigation: Chromium sends its own Accept (text/html,...).
  const response = await page.goto(`${base}/graphql`, { waitUntil: "load" });
  if (response.status() !== 200) throw new Error(`GET /graphql: ${response.status()}`);
  const editor = ".graphiql-query-editor .CodeMirror";
  await page.waitForSelector(editor);
  await page.evaluate(
    ([selector, text]) => document.querySelector(selector).CodeMirror.setValue(text),
    [editor, query],
  );
  await page.click(".graphiql-execute-button");
  // The answer: the response pane's text once it parses as a GraphQL response.
  const answer = await page.waitForFunction(() => {
    const pane = document.querySelector(".graphiql-response .CodeMirror");
    const text = pane?.CodeMirror?.getValue();
    try {
      const body = JSON.parse(text);
      return body && (body.data || body.errors) ? text : null;
    } catch {
      return null;
    }
  });
  out.result = await answer.jsonValue();
  // The documentation explorer (the schema GraphiQL introspected) and the
  // settings dialog (which adds an inline <style> to lock scrolling): what
  // the CSP allows is what GraphiQL does.
  await page.click('[aria-label="Show Documentation Explorer"]');
  await page.waitForSelector(".graphiql-doc-explorer-content >> text=Query");
  await page.click('[aria-label="Open settings dialog"]');
  await page.waitForSelector(".graphiql-dialog");
  await page.keyboard.press("Escape");
  await page.waitForSelector(".graphiql-dialog", { state: "detached" });
  // Violation events are queued tasks: let those already queued run.
  await page.evaluate(() => new Promise((resolve) => setTimeout(resolve, 0)));
  clearTimeout(deadline);
  await finish(0);
} catch (error) {
  clearTimeout(deadline);
  await finish(1, error);
}
