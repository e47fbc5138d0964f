// Apollo Client 4 (the package root: no React) against {base}/graphql, each
// scenario on a fresh client and InMemoryCache, every query `no-cache`:
//
//  get       HttpLink({ useGETForQueries: true }): one query with variables.
//  pq_post   PersistedQueryLink (sha256 from node:crypto) over HttpLink (POST):
//            the same query run twice.
//  pq_get    the same with useGETForHashedQueries: true (another query, so
//            the gateway has not seen its hash yet).
//  batch     BatchHttpLink: three queries in one HTTP request.
//  pq_batch  PersistedQueryLink over BatchHttpLink: two queries batched, run
//            twice (automatic persisted queries inside a batch).
//
// Prints {"scenarios": {NAME: {runs: [[{operationName, data, error}]], exchanges}}}:
// `runs[i]` the answers the client gave for run i, `exchanges` every HTTP
// exchange of the scenario in order (request method, URL, headers, body;
// response status, headers, body, parsed json).
import { createHash } from 'node:crypto';
import { ApolloClient, ApolloLink, HttpLink, InMemoryCache, gql } from '@apollo/client';
import { BatchHttpLink } from '@apollo/client/link/batch-http';
import { PersistedQueryLink } from '@apollo/client/link/persisted-queries';
import { baseUrl, errorJson, recordingFetch, run } from './record.mjs';

const sha256 = (text) => createHash('sha256').update(text).digest('hex');

const REPO = gql`
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

const PQ_POST = gql`
  query PqPost($name: String!) {
    repository(name: $name) {
      name
      tag(name: "t01") {
        name
      }
    }
  }
`;

const PQ_GET = gql`
  query PqGet($name: String!) {
    repository(name: $name) {
      name
      tag(name: "t02") {
        name
      }
    }
  }
`;

// The batch: repositories no other scenario touches, so the Rust side can
// count their upstream reads exactly. Deep1 reads the tag list, the v1
// manifest and its config blob; Deep2 needs the same tag list and manifest
// (shared: zero reads of its own); Multi reads its tag list and index.
const DEEP1 = gql`
  query Deep1 {
    repository(name: "org/team/deep") {
      tag(name: "v1") {
        manifest {
          digest
          config {
            os
            architecture
          }
        }
      }
    }
  }
`;

const DEEP2 = gql`
  query Deep2 {
    repository(name: "org/team/deep") {
      name
      tags(first: 5) {
        nodes {
          name
          manifest {
            digest
          }
        }
      }
    }
  }
`;

const MULTI = gql`
  query Multi {
    repository(name: "acme/multi") {
      tag(name: "latest") {
        manifest {
          mediaType
          manifests {
            platform {
              os
              architecture
              variant
            }
          }
        }
      }
    }
  }
`;

const PQ_BATCH_A = gql`
  query PqBatchA {
    repository(name: "filler/r01") {
      name
      tag(name: "latest") {
        name
      }
    }
  }
`;

const PQ_BATCH_B = gql`
  query PqBatchB {
    repository(name: "filler/r02") {
      name
      tag(name: "latest") {
        name
      }
    }
  }
`;

function client(link) {
  return new ApolloClient({
    link,
    cache: new InMemoryCache(),
    defaultOptions: {
      query: { fetchPolicy: 'no-cache', errorPolicy: 'none' },
      watchQuery: { fetchPolicy: 'no-cache' },
    },
  });
}

async function answer(apollo, query, variables) {
  const operationName = query.definitions.find((d) => d.kind === 'OperationDefinition')?.name?.value ?? null;
  try {
    const result = await apollo.query({ query, variables, fetchPolicy: 'no-cache' });
    return { operationName, data: result.data ?? null, error: errorJson(result.error) };
  } catch (error) {
    return { operationName, data: null, error: errorJson(error) };
  }
}

/** Runs `runs` (each a list of [query, variables], sent at once) on a fresh client over `makeLink(fetch)`. */
async function scenario(makeLink, runs) {
  const exchanges = [];
  const apollo = client(makeLink(recordingFetch(exchanges)));
  const answers = [];
  for (const operations of runs) {
    answers.push(await Promise.all(operations.map(([query, variables]) => answer(apollo, query, variables))));
  }
  apollo.stop();
  return { runs: answers, exchanges };
}

run(async () => {
  const uri = baseUrl() + '/graphql';
  const name = { name: 'acme/app' };
  const scenarios = {};

  scenarios.get = await scenario((fetch) => new HttpLink({ uri, fetch, useGETForQueries: true }), [[[REPO, name]]]);

  scenarios.pq_post = await scenario(
    (fetch) => ApolloLink.from([new PersistedQueryLink({ sha256 }), new HttpLink({ uri, fetch })]),
    [[[PQ_POST, name]], [[PQ_POST, name]]],
  );

  scenarios.pq_get = await scenario(
    (fetch) =>
      ApolloLink.from([new PersistedQueryLink({ sha256, useGETForHashedQueries: true }), new HttpLink({ uri, fetch })]),
    [[[PQ_GET, name]], [[PQ_GET, name]]],
  );

  // batchMax = the batch's size: the link sends as soon as all three are queued.
  scenarios.batch = await scenario(
    (fetch) => new BatchHttpLink({ uri, fetch, batchMax: 3, batchInterval: 1000 }),
    [[[DEEP1], [DEEP2], [MULTI]]],
  );

  scenarios.pq_batch = await scenario(
    (fetch) =>
      ApolloLink.from([new PersistedQueryLink({ sha256 }), new BatchHttpLink({ uri, fetch, batchMax: 2, batchInterval: 1000 })]),
    [
      [[PQ_BATCH_A], [PQ_BATCH_B]],
      [[PQ_BATCH_A], [PQ_BATCH_B]],
    ],
  );

  return { uri, scenarios };
});
