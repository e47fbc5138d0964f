// graphql-http's GraphQL-over-HTTP server audits against {base}/graphql.
// Prints {"url", "results": [{id, name, status, reason, exchanges}]}; status is
// ok / notice (MAY) / warn (SHOULD) / error (MUST). An audit that threw
// something other than an audit failure (a connection error) is an `error`
// whose reason starts with "crashed:".
import { serverAudits } from 'graphql-http';
import { baseUrl, recordingFetch, run } from './record.mjs';

run(async () => {
  const url = baseUrl() + '/graphql';
  let exchanges = [];
  const record = (...args) => recordingFetch(exchanges)(...args);
  const results = [];
  // One at a time, so that each audit's exchanges are its own.
  for (const audit of serverAudits({ url, fetchFn: record })) {
    exchanges = [];
    let result;
    try {
      result = await audit.fn();
    } catch (error) {
      result = { id: audit.id, name: audit.name, status: 'error', reason: `crashed: ${error?.stack ?? error}` };
    }
    results.push({
      id: result.id,
      name: result.name,
      status: result.status,
      reason: result.reason ?? null,
      exchanges: exchanges.map(({ method, url, headers, body, response }) => ({
        method,
        url,
        headers,
        body,
        response: response && { status: response.status, headers: response.headers, body: response.body, error: response.error },
      })),
    });
  }
  return { url, results };
});
