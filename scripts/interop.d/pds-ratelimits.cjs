// Makes the reference PDS's global per-IP rate limit (3000 requests per
// 5 minutes in @atproto/pds 0.5.x) settable from the environment, so tier
// 2 can make the backfill meet it within a short run:
// INTEROP_PDS_GLOBAL_POINTS requests per INTEROP_PDS_GLOBAL_WINDOW_MS.
// Unset, the PDS keeps its own figures. Idempotent; fails loudly when the
// rule is not where 0.5.x has it.
const fs = require("fs");
const path = require("path");
const f = path.join(process.argv[2], "node_modules/@atproto/pds/dist/rate-limits.js");
const src = fs.readFileSync(f, "utf8");
if (src.includes("INTEROP_PDS_GLOBAL_POINTS")) process.exit(0);
const rule = /name: 'global-ip',(\s*)durationMs: 5 \* MINUTE,(\s*)points: 3000,/;
if (!rule.test(src)) throw new Error(`${f}: global-ip rate limit rule not found`);
fs.writeFileSync(f, src.replace(rule,
  "name: 'global-ip',$1durationMs: Number(process.env.INTEROP_PDS_GLOBAL_WINDOW_MS) || 5 * MINUTE,$2" +
  "points: Number(process.env.INTEROP_PDS_GLOBAL_POINTS) || 3000,"));
console.log("pds-ratelimits: global-ip limit made settable");
