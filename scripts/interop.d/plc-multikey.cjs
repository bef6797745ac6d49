// Patches an installed @did-plc/server (0.0.1, its only release) so its DID
// documents use the current key format: a "Multikey" verification method
// whose publicKeyMultibase is the did:key suffix, id "<did>#atproto", and the
// https://w3id.org/security/multikey/v1 context. Its own builder emits the
// 2023 format (EcdsaSecp256k1VerificationKey2019, uncompressed key), which
// current atproto code refuses ("unknown multicodec prefix").
// Usage: node plc-multikey.cjs <install dir>. Exits non-zero when the
// builder is not found, so a changed package fails the install loudly.
const fs = require("fs");
const path = require("path");
const dir = process.argv[2];
const files = [
  "node_modules/@did-plc/server/dist/index.js",
  "node_modules/@did-plc/lib/dist/index.js",
];
const builder =
  /const info = formatKeyAndContext\(key\);(\s*)if \(!context\.includes\(info\.context\)\) \{\s*context\.push\(info\.context\);\s*\}\s*verificationMethods\.push\(\{\s*id: `#\$\{keyid\}`,/g;
const patched =
  'const info = { context: "https://w3id.org/security/multikey/v1", type: "Multikey", publicKeyMultibase: key.replace(/^did:key:/, "") };$1' +
  "if (!context.includes(info.context)) { context.push(info.context); }$1" +
  "verificationMethods.push({ id: `${data.did}#${keyid}`,";
let server = 0;
for (const rel of files) {
  const f = path.join(dir, rel);
  const src = fs.readFileSync(f, "utf8");
  const n = (src.match(builder) || []).length;
  if (n === 0) {
    if (src.includes('type: "Multikey"')) continue; // already patched
    if (rel.includes("/server/")) throw new Error(`${f}: DID document builder not found`);
    continue;
  }
  fs.writeFileSync(f, src.replace(builder, patched));
  if (rel.includes("/server/")) server += n;
  console.log(`plc-multikey: patched ${n} builder(s) in ${rel}`);
}
