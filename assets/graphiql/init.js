// Mounts GraphiQL on #graphiql, querying the endpoint in its data-endpoint
// attribute. Part of fanout-budget (not vendored); served as its own file so
// that the page needs no inline script (script-src 'self').
//
// Subscriptions go over a WebSocket to the same endpoint (ws:, or wss: on an
// https: page; connect-src 'self' allows it): GraphiQL's bundle includes
// graphql-ws's client, which createFetcher starts for `subscriptionUrl`, one
// connection per subscription, the headers editor's JSON as its
// connection_init payload (so `{"x-internal-token": "…"}` there reaches the
// socket too). Queries stay on HTTP.
(function () {
  "use strict";
  var root = document.getElementById("graphiql");
  document.body.style.margin = "0";
  root.style.height = "100vh";
  var endpoint = new URL(root.dataset.endpoint, window.location.href);
  var socket = new URL(endpoint.href);
  socket.protocol = endpoint.protocol === "https:" ? "wss:" : "ws:";
  var fetcher = GraphiQL.createFetcher({
    url: endpoint.href,
    subscriptionUrl: socket.href,
  });
  var props = { fetcher: fetcher };
  // The query the editor opens on, for a visitor who has none of their own
  // (GraphiQL keeps the last one in localStorage).
  if (root.dataset.query) {
    props.defaultQuery = root.dataset.query;
  }
  ReactDOM.createRoot(root).render(React.createElement(GraphiQL, props));
})();
