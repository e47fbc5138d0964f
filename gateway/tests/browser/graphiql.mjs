// Drives headless Chromium through the gateway's GraphiQL, offline:
//   node gateway/tests/browser/graphiql.mjs http://127.0.0.1:PORT
// Every request that is not for a loopback address is aborted and recorded.
// Opens <url>/graphql, waits for the editor, runs the query (argument 2,
// default below) with the execute button, waits for the answer, opens the
// docs and the settings dialog. With a subscription (argument 3), it then
// runs that in the same editor (GraphiQL opens a WebSocket to the endpoint),
// waits for the result pane to show an event with a digest (any field named
// "digest" in its data), prints the line `PUSH <digest>`, and waits for the
// pane to show an event with another digest (the caller pushes a change when
// it reads the line). It records what the editor opened on ("initialQuery")
// and the text of the query type's page in the docs ("docs"). Last, it prints one JSON line:
//   {"blocked":[...],"consoleErrors":[...],"cspViolations":[...],"result":"...","events":[...]}
// (plus "requests", the loopback URLs fetched; "websockets", the URLs of the
// WebSockets the page opened, which routing does not see; "events" the panes' texts). Exit 0 when it got that far,
// 1 on a failure (the line then carries "error"). Each step is bounded, and
// so is the whole run; the browser is closed on every path.
// CHROMIUM overrides the browser (default /usr/bin/chromium).
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const base = process.argv[2];
const query = process.argv[3] ?? "{ repositories(first: 5) { nodes { name } } }";
const subscription = process.argv[4];
const STEP_MS = 30_000;
const RUN_MS = 90_000;

const out = { blocked: [], consoleErrors: [], cspViolations: [], requests: [], websockets: [], result: null, events: [] };
const profile = mkdtempSync(join(tmpdir(), "fanout-graphiql-"));
let context;
let page;
let finished = false;

async function finish(code, error) {
  if (finished) return;
  finished = true;
  if (error) out.error = String(error?.stack ?? error);
  // What the result pane showed when it failed.
  if (error && page) {
    out.pane = await page
      .evaluate(() => document.querySelector(".graphiql-response .CodeMirror")?.CodeMirror?.getValue() ?? null)
      .catch(() => null);
  }
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

  page = context.pages()[0] ?? (await context.newPage());
  page.on("console", (message) => {
    if (message.type() !== "error") return;
    out.consoleErrors.push(message.text());
    if (/Content Security Policy/i.test(message.text())) {
      out.cspViolations.push({ console: message.text() });
    }
  });
  page.on("websocket", (socket) => out.websockets.push(socket.url()));
  page.on("pageerror", (error) => out.consoleErrors.push(`uncaught: ${error.message}`));

  // A navigation: Chromium sends its own Accept (text/html,...).
  const response = await page.goto(`${base}/graphql`, { waitUntil: "load" });
  if (response.status() !== 200) throw new Error(`GET /graphql: ${response.status()}`);
  const editor = ".graphiql-query-editor .CodeMirror";
  await page.waitForSelector(editor);
  // What the editor opened on (a fresh profile: no query of the visitor's own).
  out.initialQuery = await page.evaluate((selector) => document.querySelector(selector).CodeMirror.getValue(), editor);
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
  // The query type's page: its fields with the schema's descriptions.
  await page.click(".graphiql-doc-explorer-content a >> text=Query");
  await page.waitForSelector(".graphiql-doc-explorer-content >> text=repositories");
  out.docs = await page.textContent(".graphiql-doc-explorer-content");
  await page.click('[aria-label="Open settings dialog"]');
  await page.waitForSelector(".graphiql-dialog");
  await page.keyboard.press("Escape");
  await page.waitForSelector(".graphiql-dialog", { state: "detached" });
  if (subscription) {
    await page.evaluate(
      ([selector, text]) => document.querySelector(selector).CodeMirror.setValue(text),
      [editor, subscription],
    );
    // GraphiQL parses the editor's text after a debounce and keeps the
    // document on the editor; its fetcher picks the WebSocket by that
    // document: wait until it is the subscription.
    await page.waitForFunction(
      (selector) =>
        document
          .querySelector(selector)
          .CodeMirror.documentAST?.definitions?.some((d) => d.operation === "subscription"),
      editor,
    );
    await page.click(".graphiql-execute-button");
    // An event in the pane whose data has a digest other than `seen`'s.
    const event = (seen) =>
      page.waitForFunction((seen) => {
        const text = document.querySelector(".graphiql-response .CodeMirror")?.CodeMirror?.getValue();
        let digest = null;
        try {
          JSON.stringify(JSON.parse(text).data, (key, value) => {
            if (key === "digest" && typeof value === "string") digest = value;
            return value;
          });
        } catch {
          return null;
        }
        return digest && digest !== seen ? { text, digest } : null;
      }, seen);
    const first = await (await event(null)).jsonValue();
    out.events.push(first.text);
    process.stdout.write(`PUSH ${first.digest}\n`);
    const changed = await (await event(first.digest)).jsonValue();
    out.events.push(changed.text);
  }
  // Violation events are queued tasks: let those already queued run.
  await page.evaluate(() => new Promise((resolve) => setTimeout(resolve, 0)));
  clearTimeout(deadline);
  await finish(0);
} catch (error) {
  clearTimeout(deadline);
  await finish(1, error);
}
