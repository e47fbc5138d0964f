// Subscriptions over WebSocket with three real clients against
// ws://{base}/graphql, each on connections of its own:
//
//  graphql-ws  graphql-ws's createClient (graphql-transport-ws), `ws` as the
//              WebSocket of Node 20.
//  apollo      Apollo Client 4 with GraphQLWsLink (on a graphql-ws client) as
//              its only link: queries go over the socket too.
//  urql        @urql/core with subscriptionExchange (graphql-ws's client
//              underneath, enableAllOperations) as its only exchange.
//
// For each client: (1) `tagChanges` on its own tag — the first event, then
// the script prints the line `PUSH <repository>:<tag>` on stdout, the Rust
// side pushes a new image under that tag, and the next event is awaited;
// (2) a query over the socket; (3) the same query on a connection whose
// connectionParams carry the internal token (argv[3]) and on one with a
// forged token: their `extensions.fanout` as the client saw them.
//
// Prints {"clients": {NAME: {first, changed, query, internal, forged,
// protocols}}} after the PUSH lines: each result as {data, errors,
// extensions} (or {error}), `protocols` the subprotocols the sockets agreed.
import WebSocket from 'ws';
import { createClient } from 'graphql-ws';
import { ApolloClient, ApolloLink, InMemoryCache, gql } from '@apollo/client';
import { GraphQLWsLink } from '@apollo/client/link/subscriptions';
import { Client as UrqlClient, subscriptionExchange } from '@urql/core';
import { map } from 'rxjs';
import { baseUrl, errorJson, run } from './record.mjs';

/** How long one event or answer may take (the gateway polls every second). */
const EVENT_TIMEOUT_MS = 20_000;

const TAG_CHANGES = `subscription Changes($repository: String!, $tag: String!) {
  tagChanges(repository: $repository, tag: $tag) { repository tag digest mediaType }
}`;
const QUERY = `query Tag { repository(name: "acme/app") { name tag(name: "t01") { name } } }`;

/** The subprotocol of every socket a client opened. */
const protocols = [];
class RecordedWebSocket extends WebSocket {
  constructor(...args) {
    super(...args);
    this.addEventListener('open', () => protocols.push(this.protocol));
  }
}

function wsUrl() {
  return baseUrl().replace(/^http/, 'ws') + '/graphql';
}

/** A graphql-ws client; `token` (if any) in connectionParams. */
function wsClient(token) {
  return createClient({
    url: wsUrl(),
    webSocketImpl: RecordedWebSocket,
    connectionParams: token === undefined ? {} : { 'x-internal-token': token },
    retryAttempts: 0,
    lazy: true,
  });
}

function within(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: nothing within ${EVENT_TIMEOUT_MS} ms`)), EVENT_TIMEOUT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** A result as the client gave it: data, errors, extensions. */
function result(r) {
  return { data: r?.data ?? null, errors: r?.errors ?? null, extensions: r?.extensions ?? null };
}

/**
 * Events of one subscription as a queue: `start(push)` starts it, each
 * `next()` resolves with the next event; `stop()` ends it.
 */
function events(start) {
  const queue = [];
  const waiting = [];
  const deliver = (item) => (waiting.length ? waiting.shift()(item) : queue.push(item));
  const stop = start({
    next: (value) => deliver({ value }),
    error: (error) => deliver({ error: errorJson(error instanceof Error ? error : { message: JSON.stringify(error) }) }),
  });
  return {
    next: (what) => within(new Promise((resolve) => (queue.length ? resolve(queue.shift()) : waiting.push(resolve))), what),
    stop,
  };
}

/** The change scenario on `tag`: first event, the push, the changed event. */
async function changes(name, subscribe, tag) {
  const stream = events((sink) => subscribe({ repository: 'acme/app', tag }, sink));
  try {
    const first = await stream.next(`${name}: the first event`);
    console.log(`PUSH acme/app:${tag}`);
    const changed = await stream.next(`${name}: the event after the push`);
    return {
      first: first.error ? first : result(first.value),
      changed: changed.error ? changed : result(changed.value),
    };
  } finally {
    stream.stop();
  }
}

async function withGraphqlWs() {
  const query = async (token) => {
    const client = wsClient(token);
    try {
      const iterator = client.iterate({ query: QUERY });
      const answer = await within(iterator.next(), 'graphql-ws: the query');
      await iterator.return?.();
      return result(answer.value);
    } catch (error) {
      return { error: errorJson(error) };
    } finally {
      await client.dispose();
    }
  };
  const client = wsClient();
  const scenario = await changes(
    'graphql-ws',
    (variables, sink) => client.subscribe({ query: TAG_CHANGES, variables }, { ...sink, complete: () => {} }),
    't10',
  );
  await client.dispose();
  return { ...scenario, query: await query(), internal: await query(process.argv[3]), forged: await query('forged') };
}

async function withApollo() {
  // Apollo hands the application `data` (and `error`); what the server sent,
  // extensions included, is recorded by a link in front of GraphQLWsLink.
  const apollo = (token, seen) => {
    const record = new ApolloLink((operation, forward) =>
      forward(operation).pipe(
        map((r) => {
          seen.push(result(r));
          return r;
        }),
      ),
    );
    const ws = wsClient(token);
    const client = new ApolloClient({
      link: ApolloLink.from([record, new GraphQLWsLink(ws)]),
      cache: new InMemoryCache(),
    });
    return { client, ws };
  };
  const query = async (token) => {
    const seen = [];
    const { client, ws } = apollo(token, seen);
    try {
      const answer = await within(client.query({ query: gql(QUERY), fetchPolicy: 'no-cache' }), 'apollo: the query');
      return { ...seen[0], client: { data: answer.data ?? null, error: errorJson(answer.error) } };
    } catch (error) {
      return { error: errorJson(error), seen };
    } finally {
      client.stop();
      await ws.dispose();
    }
  };
  const seen = [];
  const { client, ws } = apollo(undefined, seen);
  const scenario = await changes(
    'apollo',
    (variables, sink) => {
      const subscription = client
        .subscribe({ query: gql(TAG_CHANGES), variables, fetchPolicy: 'no-cache' })
        .subscribe({
          next: (r) => (r.error ? sink.error(r.error) : sink.next({ ...seen[seen.length - 1], data: r.data })),
          error: sink.error,
        });
      return () => subscription.unsubscribe();
    },
    't11',
  );
  client.stop();
  await ws.dispose();
  return { ...scenario, query: await query(), internal: await query(process.argv[3]), forged: await query('forged') };
}

async function withUrql() {
  const urql = (token) => {
    const ws = wsClient(token);
    const client = new UrqlClient({
      url: baseUrl() + '/graphql',
      exchanges: [
        subscriptionExchange({
          enableAllOperations: true,
          forwardSubscription(request) {
            const input = { ...request, query: request.query || '' };
            return {
              subscribe(sink) {
                const unsubscribe = ws.subscribe(input, sink);
                return { unsubscribe };
              },
            };
          },
        }),
      ],
    });
    return { client, ws };
  };
  const fromUrql = (r) => ({
    data: r.data ?? null,
    errors: r.error?.graphQLErrors?.length ? r.error.graphQLErrors.map((e) => ({ message: e.message, path: e.path, extensions: e.extensions })) : null,
    extensions: r.extensions ?? null,
    networkError: r.error?.networkError ? String(r.error.networkError) : null,
  });
  const query = async (token) => {
    const { client, ws } = urql(token);
    try {
      const answer = await within(client.query(QUERY, {}, { requestPolicy: 'network-only' }).toPromise(), 'urql: the query');
      return fromUrql(answer);
    } catch (error) {
      return { error: errorJson(error) };
    } finally {
      await ws.dispose();
    }
  };
  const { client, ws } = urql();
  const scenario = await changes(
    'urql',
    (variables, sink) => {
      const { unsubscribe } = client.subscription(TAG_CHANGES, variables).subscribe((r) => sink.next(fromUrql(r)));
      return unsubscribe;
    },
    't12',
  );
  await ws.dispose();
  return { ...scenario, query: await query(), internal: await query(process.argv[3]), forged: await query('forged') };
}

run(async () => {
  const clients = {};
  for (const [name, scenario] of [
    ['graphql-ws', withGraphqlWs],
    ['apollo', withApollo],
    ['urql', withUrql],
  ]) {
    protocols.length = 0;
    try {
      clients[name] = await scenario();
    } catch (error) {
      clients[name] = { error: errorJson(error) };
    }
    clients[name].protocols = [...protocols];
  }
  return { clients };
});
