// src/openapi.ts is what `npm run generate` makes of api/openapi.yaml: a
// change to the spec without regenerating the types fails here.
import { strict as assert } from "node:assert";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const pkg = fileURLToPath(new URL("../../", import.meta.url));

test("src/openapi.ts is generated from api/openapi.yaml as it is now", async () => {
  const dir = await mkdtemp(join(tmpdir(), "allot-ts-gen-"));
  try {
    const out = join(dir, "openapi.ts");
    await promisify(execFile)(process.execPath, ["node_modules/openapi-typescript/bin/cli.js", "../../api/openapi.yaml", "-o", out], { cwd: pkg });
    const [fresh, committed] = await Promise.all([readFile(out, "utf8"), readFile(join(pkg, "src/openapi.ts"), "utf8")]);
    assert.ok(fresh.includes("export interface components"), "the generator wrote no types");
    assert.ok(fresh === committed, "src/openapi.ts differs from the types api/openapi.yaml gives: run `npm run generate` in clients/ts and commit the result");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
