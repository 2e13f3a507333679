// Validates an AsyncAPI document with the official parser (@asyncapi/parser 3), as tooling would.
// Usage: node check.mjs PATH; prints every diagnostic, exits 1 if any is an error.
import { Parser } from '@asyncapi/parser';
import fs from 'fs';

const SEVERITY = ['error', 'warning', 'info', 'hint'];
const parser = new Parser();
const { document, diagnostics } = await parser.parse(fs.readFileSync(process.argv[2], 'utf8'));
for (const d of diagnostics) {
  console.log(`${SEVERITY[d.severity]} ${d.code} ${d.path.join('.')}: ${d.message}`);
}
const errors = diagnostics.filter((d) => d.severity === 0).length;
console.log(`errors: ${errors}, diagnostics: ${diagnostics.length}, parsed: ${document !== undefined}`);
process.exit(errors || document === undefined ? 1 : 0);
