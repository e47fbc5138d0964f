// Shared by the client scripts: the base URL from argv, a fetch that records
// every exchange, and printing the one JSON document the Rust side parses.

/** The gateway's base URL (`http://127.0.0.1:PORT`), without a trailing slash. */
export function baseUrl() {
  const base = process.argv[2];
  if (!base) {
    console.error(`usage: node ${process.argv[1]} <gateway base URL>`);
    process.exit(2);
  }
  return base.replace(/\/+$/, '');
}

/** Headers (a `Headers`, an array of pairs or a plain object) as a plain object, names lower-cased. */
export function headersObject(headers) {
  const out = {};
  new Headers(headers ?? {}).forEach((value, name) => {
    out[name] = value;
  });
  return out;
}

function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** Milliseconds one HTTP exchange may take before the recorder aborts it. */
const EXCHANGE_TIMEOUT_MS = 15_000;

/**
 * A `fetch` that appends one entry per exchange to `log`:
 * `{ method, url, headers, body, response: { status, headers, body, json } }`
 * (`response.error` instead when the exchange failed). `body` is the request
 * body when it is a string (`null` when there is none).
 */
export function recordingFetch(log) {
  return async (input, init = {}) => {
    const request = new Request(input, init);
    const entry = {
      method: request.method,
      url: request.url,
      headers: headersObject(request.headers),
      body: typeof init.body === 'string' ? init.body : init.body == null ? null : String(init.body),
    };
    log.push(entry);
    const timeout = AbortSignal.timeout(EXCHANGE_TIMEOUT_MS);
    // AbortSignal.any is Node >= 20.3; without it the client's own signal wins.
    const signal = !init.signal ? timeout : AbortSignal.any ? AbortSignal.any([init.signal, timeout]) : init.signal;
    try {
      const response = await fetch(input, { ...init, signal });
      const text = await response.clone().text();
      entry.response = {
        status: response.status,
        headers: headersObject(response.headers),
        body: text,
        json: parseJson(text),
      };
      return response;
    } catch (error) {
      entry.response = { error: String(error?.stack ?? error) };
      throw error;
    }
  };
}

/** An error as JSON: its name, message and, for GraphQL errors, the errors. */
export function errorJson(error) {
  if (error == null) return null;
  const out = { name: error.name ?? typeof error, message: String(error.message ?? error) };
  if (Array.isArray(error.errors)) out.errors = error.errors;
  if (Array.isArray(error.graphQLErrors) && error.graphQLErrors.length) out.graphQLErrors = error.graphQLErrors;
  if (error.networkError) out.networkError = String(error.networkError);
  if (error.statusCode !== undefined) out.statusCode = error.statusCode;
  if (error.bodyText !== undefined) out.bodyText = error.bodyText;
  return out;
}

/** Prints `doc` as the script's one JSON document and exits 0. */
export function finish(doc) {
  process.stdout.write(JSON.stringify(doc, null, 1) + '\n', () => process.exit(0));
}

/** Runs `main`; a crash prints its stack on stderr and exits 1. */
export function run(main) {
  main().then(finish, (error) => {
    console.error(error?.stack ?? String(error));
    process.exit(1);
  });
}
