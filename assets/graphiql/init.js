// Mounts GraphiQL on #graphiql, querying the endpoint in its data-endpoint
// attribute. Part of fanout-budget (not vendored); served as its own file so
// that the page needs no inline script (script-src 'self').
(function () {
  "use strict";
  var root = document.getElementById("graphiql");
  document.body.style.margin = "0";
  root.style.height = "100vh";
  var fetcher = GraphiQL.createFetcher({ url: root.dataset.endpoint });
  ReactDOM.createRoot(root).render(React.createElement(GraphiQL, { fetcher: fetcher }));
})();
