// @urql/core against {base}/graphql with the client's defaults
// (cacheExchange + fetchExchange, preferGetMethod "within-url-limit": queries
// whose URL fits 2,047 characters go as GET), every query network-only.
//
// Prints {"runs": [{name, preferGetMethod, variables, data, extensions, error,
// exchanges}]} where `exchanges` are the HTTP exchanges of that run.
//
// The runs: the query with variables over urql's default GET; the same
// operation with preferGetMethod: false (urql's POST, the path a client takes
// for a query too long for a URL, and for mutations, which this schema lacks).
import { Client, cacheExchange, fetchExchange, gql } from '@urql/core';
import { baseUrl, recordingFetch, run } from './record.mjs';

const REPO_QUERY = gql`
  query Repo($name: String!) {
    repository(name: $name) {
      name
      tags(first: 5) {
        nodes {
          name
        }
      }
    }
  }
`;

run(async () => {
  const url = baseUrl() + '/graphql';
  const runs = [];
  for (const [name, preferGetMethod] of [
    ['default', undefined],
    ['post', false],
  ]) {
    const exchanges = [];
    const client = new Client({
      url,
      exchanges: [cacheExchange, fetchExchange],
      requestPolicy: 'network-only',
      fetch: recordingFetch(exchanges),
      ...(preferGetMethod === undefined ? {} : { preferGetMethod }),
    });
    const variables = { name: 'acme/app' };
    const result = await client.query(REPO_QUERY, variables, { requestPolicy: 'network-only' }).toPromise();
    runs.push({
      name,
      preferGetMethod: preferGetMethod ?? 'default',
      variables,
      data: result.data ?? null,
      extensions: result.extensions ?? null,
      error: result.error
        ? {
            message: result.error.message,
            graphQLErrors: result.error.graphQLErrors.map((e) => ({ message: e.message, path: e.path, extensions: e.extensions })),
            networkError: result.error.networkError ? String(result.error.networkError) : null,
          }
        : null,
      exchanges,
    });
  }
  return { runs };
});
