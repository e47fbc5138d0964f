#!/usr/bin/env bash
# Re-vendors GraphiQL and React from the npm registry (README.md here says
# what and why). Usage: bash assets/graphiql/update.sh [GRAPHIQL] [REACT]
# (defaults 3.9.0 and 18.3.1; React 19 has no UMD build). Then update the
# names in src/graphiql.rs and the table in README.md from what it prints.
set -euo pipefail
graphiql=${1:-3.9.0}
react=${2:-18.3.1}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

npm pack --silent "graphiql@$graphiql" "react@$react" "react-dom@$react" >/dev/null
for tgz in *.tgz; do mkdir "${tgz%.tgz}" && tar xzf "$tgz" -C "${tgz%.tgz}"; done
rm -f "$here"/*.min.js "$here"/*.min.css
cp "graphiql-$graphiql/package/graphiql.min.js" "$here/graphiql-$graphiql.min.js"
cp "graphiql-$graphiql/package/graphiql.min.css" "$here/graphiql-$graphiql.min.css"
cp "react-$react/package/umd/react.production.min.js" "$here/react-$react.production.min.js"
cp "react-dom-$react/package/umd/react-dom.production.min.js" "$here/react-dom-$react.production.min.js"
mkdir -p "$here/LICENSES"
cp "graphiql-$graphiql/package/LICENSE" "$here/LICENSES/graphiql.txt"
cp "react-$react/package/LICENSE" "$here/LICENSES/react.txt"
cp "react-dom-$react/package/LICENSE" "$here/LICENSES/react-dom.txt"

# graphiql's UMD bundle includes its dependencies but its tarball ships no
# notices: the source map names the bundled packages; their licence texts
# come from the packages npm resolves for graphiql's dependency ranges (or,
# for the few outside that tree, their latest release).
mkdir deps && (cd deps && echo '{"private":true}' >package.json &&
    npm install --silent --ignore-scripts --no-audit --no-fund \
        "graphiql@$graphiql" "react@$react" "react-dom@$react" graphql@16 >/dev/null)
node - "graphiql-$graphiql/package/graphiql.min.js.map" deps >"$here/LICENSES/bundled-in-graphiql.txt" <<'EOF'
const fs = require("fs"), path = require("path"), { execSync } = require("child_process");
const [map, deps] = process.argv.slice(2).map((p) => path.resolve(p));
const MIT = `Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
`;
const names = new Set(["@graphiql/react", "@graphiql/toolkit"]);
for (const source of JSON.parse(fs.readFileSync(map, "utf8")).sources) {
  const at = source.lastIndexOf("node_modules/");
  if (at >= 0) {
    const parts = source.slice(at + 13).split("/");
    names.add(parts[0].startsWith("@") ? `${parts[0]}/${parts[1]}` : parts[0]);
  } else {
    const own = source.match(/^\.\.\/\.\.\/(codemirror-graphql|graphql-language-service)\//);
    if (own) names.add(own[1]);
  }
}
names.delete("react"); // LICENSES/react.txt
let out = "Packages bundled in graphiql.min.js (from its source map) and their licences.\n";
out += "Versions are those npm resolved when this file was made; the bundle was\n";
out += "built from graphiql's own lockfile, so a version may differ slightly.\n";
for (const name of [...names].sort()) {
  let dir = path.join(deps, "node_modules", name);
  if (!fs.existsSync(dir)) {
    const tgz = execSync(`npm pack --silent ${name}`, { cwd: deps }).toString().trim();
    dir = path.join(deps, "extra", name);
    fs.mkdirSync(dir, { recursive: true });
    execSync(`tar xzf ${tgz} -C ${dir} --strip-components=1`, { cwd: deps });
  }
  const pkg = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8"));
  const file = fs.readdirSync(dir).find((f) => /^(licen[cs]e|copying)/i.test(f));
  const author = typeof pkg.author === "string" ? pkg.author : pkg.author?.name;
  out += `\n${"=".repeat(72)}\n${name}@${pkg.version} (${pkg.license})\n${"=".repeat(72)}\n`;
  out += file
    ? fs.readFileSync(path.join(dir, file), "utf8").trim() + "\n"
    : `The package ships no licence file; package.json says "${pkg.license}"` +
      (author ? `, author ${author}` : "") + ". The MIT licence text:\n\n" + MIT;
}
process.stdout.write(out);
EOF
cd "$here" && sha256sum ./*.min.js ./*.min.css
