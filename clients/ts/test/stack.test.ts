// The client against the real stack, as `make run` runs it: the stack
// binary (internal/cmd/stack: embedded JetStream, migrations, allocator,
// ingest) built with `go build`, on free ports, with a database of its own
// on the test server (ALLOT_TEST_MYSQL_DSN, default root at 127.0.0.1:3306)
// that `stack -reset` drops afterwards; authentication on (an HS256 key, a
// token minted by internal/cmd/token); and the notifier (cmd/notifier)
// POSTing events to a webhook receiver here, which decodes them.
//
// Without go or a database server it skips, saying so; with CI=true it fails.
import { strict as assert } from "node:assert";
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { AllotError, Client, decodeEvent, newKey, type Event, type Exchange, type Result } from "@allot/client";

const run = promisify(execFile);
const repo = fileURLToPath(new URL("../../../../", import.meta.url));
const ci = process.env["CI"] === "true";
const go = process.env["GO"] || "go";

interface Hook {
  headers: IncomingHttpHeaders;
  body: string;
}

interface Stack {
  url: string;
  token: string;
  hooks: Hook[];
}

const children: ChildProcess[] = [];
const cleanups: Array<() => Promise<void>> = [];
process.on("exit", () => children.forEach((c) => c.kill("SIGKILL")));

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve) => s.listen(0, "127.0.0.1", resolve));
  const port = (s.address() as AddressInfo).port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}

/** dsn with its database name replaced (a go-sql-driver DSN: [user@]proto(addr)/name[?params]). */
function withDatabase(dsn: string, name: string): string {
  const q = dsn.indexOf("?");
  const head = q < 0 ? dsn : dsn.slice(0, q);
  const slash = head.lastIndexOf("/");
  if (slash < 0) throw new Error(`ALLOT_TEST_MYSQL_DSN ${dsn} has no /dbname part`);
  return head.slice(0, slash + 1) + name + (q < 0 ? "" : dsn.slice(q));
}

function start(bin: string, env: NodeJS.ProcessEnv, log: string[]): ChildProcess {
  const p = spawn(bin, [], { env, stdio: ["ignore", "ignore", "pipe"] });
  p.stderr?.setEncoding("utf8").on("data", (d: string) => log.push(d));
  children.push(p);
  return p;
}

async function stop(p: ChildProcess): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => p.once("exit", () => resolve()));
  p.kill("SIGTERM");
  await exited;
}

/** Starts the stack, or says why it cannot here (a skip; a failure under CI). */
async function startStack(): Promise<Stack | string> {
  const tmp = await mkdtemp(join(tmpdir(), "allot-ts-"));
  cleanups.push(() => rm(tmp, { recursive: true, force: true }));
  try {
    await run(go, ["build", "-o", tmp + "/", "./internal/cmd/stack", "./internal/cmd/token", "./cmd/notifier"], { cwd: repo });
  } catch (e) {
    const err = e as NodeJS.ErrnoException & { stderr?: string };
    if (err.code === "ENOENT") return `${go} is not installed`;
    throw new Error(`go build: ${err.stderr ?? String(e)}`);
  }
  const [httpPort, natsPort] = [await freePort(), await freePort()];
  const key = randomBytes(32).toString("hex");
  const base = process.env["ALLOT_TEST_MYSQL_DSN"] || "root@tcp(127.0.0.1:3306)/?parseTime=true";
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    ALLOT_MYSQL_DSN: withDatabase(base, `allot_tsclient_${randomBytes(6).toString("hex")}`),
    ALLOT_HTTP_ADDR: `127.0.0.1:${httpPort}`,
    ALLOT_NATS_URL: "",
    ALLOT_EMBEDDED_NATS_PORT: String(natsPort),
    ALLOT_EMBEDDED_NATS_STORE: join(tmp, "nats"),
    ALLOT_AUTH_HS256_KEY: key,
    ALLOT_INGEST_USER_RATE: "0",
    ALLOT_LOG_LEVEL: "warn",
  };
  const log: string[] = [];
  const stack = start(join(tmp, "stack"), env, log);
  // Dropped after the stack stops: -reset deletes its database and NATS store.
  cleanups.unshift(async () => {
    await stop(stack);
    try {
      await run(join(tmp, "stack"), ["-reset"], { env });
    } catch (e) {
      console.error(`stack -reset: ${(e as { stderr?: string }).stderr ?? String(e)}`);
    }
  });
  const url = `http://127.0.0.1:${httpPort}`;
  for (let i = 0; ; i++) {
    if (stack.exitCode !== null) {
      const out = log.join("");
      const why = out.split("\n").find((l) => /unreachable|connection refused/i.test(l));
      if (why !== undefined) return `no database server answers at ${base}: ${why.trim()}`;
      throw new Error(`the stack exited with ${stack.exitCode}:\n${out}`);
    }
    try {
      if ((await fetch(`${url}/readyz`)).ok) break;
    } catch {
      // not listening yet
    }
    if (i > 600) throw new Error(`the stack did not get ready in a minute:\n${log.join("")}`);
    await new Promise((r) => setTimeout(r, 100));
  }

  const { stdout } = await run(join(tmp, "token"), ["-user", "dev", "-scope", "allot:admin"], { env });

  // The webhook receiver, and the notifier that calls it.
  const hooks: Hook[] = [];
  const receiver: Server = createServer((req, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (c: string) => (body += c));
    req.on("end", () => {
      hooks.push({ headers: req.headers, body });
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, "127.0.0.1", resolve));
  cleanups.unshift(() => new Promise<void>((resolve) => { receiver.closeAllConnections(); receiver.close(() => resolve()); }));
  const notifier = start(join(tmp, "notifier"), {
    ...env,
    ALLOT_NATS_URL: `nats://127.0.0.1:${natsPort}`,
    ALLOT_NOTIFY_URL: `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`,
    ALLOT_NOTIFY_FILTER: "alloc.evt.*.promoted,alloc.evt.*.held",
  }, []);
  cleanups.unshift(() => stop(notifier));
  return { url, token: stdout.trim(), hooks };
}

async function cleanup(): Promise<void> {
  for (const c of cleanups.splice(0)) await c();
}
let started: Stack | string;
try {
  started = await startStack();
} catch (e) {
  await cleanup();
  throw e;
}
if (typeof started === "string") {
  await cleanup();
  if (ci) throw new Error(`the client's stack test cannot run: ${started}`);
  console.log(`skipping the client's stack test: ${started}`);
} else {
  after(cleanup);
}
const st = typeof started === "string" ? undefined : started;

function must<T>(v: T | undefined): T {
  assert.ok(v !== undefined);
  return v;
}

if (st === undefined) test("against the stack", { skip: String(started) }, () => {});
else describe("against the stack", () => {
  const s = st;
  const c = new Client(s.url, { token: s.token });
  let cancelled: Result | undefined;
  let held: Result | undefined;

  test("without a token: 401 with the server's sentence", async () => {
    await assert.rejects(new Client(s.url).activity(1), (e: unknown) => {
      assert.ok(e instanceof AllotError);
      assert.equal(e.status, 401);
      assert.match(e.sentence, /token/i);
      return true;
    });
  });

  test("open, join, the waitlist, cancel with promotion, claim sold out, state reads", async () => {
    const opened = await c.open(9001, 1);
    assert.equal(opened.outcome, "OPENED");
    assert.equal(opened.capacity, 1);
    assert.equal((await c.join(9001, 1)).outcome, "CONFIRMED");
    const w = await c.join(9001, 2);
    assert.equal(w.outcome, "WAITING");
    assert.equal(w.status, "WAITING");
    assert.equal(w.position, 1);
    assert.deepEqual(await c.signup(9001, 2), { activity_id: 9001, user_id: 2, status: "WAITING", position: 1 });
    cancelled = await c.cancel(9001, 1);
    assert.equal(cancelled.outcome, "CANCELLED");
    assert.equal(cancelled.promoted_user_id, 2);
    const sold = await c.claim(9001, 3);
    assert.equal(sold.outcome, "SOLD_OUT");
    assert.deepEqual(await c.activity(9001), { activity_id: 9001, capacity: 1, confirmed: 1, held: 0, waiting: 0, remaining: 0 });
    await assert.rejects(c.activity(424242), (e: unknown) => e instanceof AllotError && e.notFound && e.sentence !== "");
  });

  test("a hold: the seat is HELD until held_until, then confirmed", async () => {
    assert.equal((await c.open(9002, 2, { hold: 3_600_000 })).outcome, "OPENED");
    held = await c.join(9002, 1);
    assert.equal(held.outcome, "HELD");
    assert.equal(held.status, "HELD");
    assert.ok(Date.parse(must(held.held_until)) > Date.now() + 59 * 60_000, `held_until ${held.held_until}`);
    assert.equal((await c.activity(9002)).hold, "1h0m0s");
    const ok = await c.confirm(9002, 1);
    assert.equal(ok.outcome, "CONFIRMED");
    assert.equal(ok.held_until, undefined);
  });

  test("idempotency: the same key is the same request, applied once; on another path it is a 422", async () => {
    const key = newKey();
    const first = await c.submit({ op: "join", activity: 9001, user: 4, key });
    const again = await c.join(9001, 4, { key });
    assert.equal(again.request_id, first.requestId);
    assert.equal(again.outcome, "WAITING");
    assert.equal(again.position, 1);
    assert.equal((await c.activity(9001)).waiting, 1, "applied once");
    await assert.rejects(c.cancel(9001, 4, { key }), (e: unknown) => {
      assert.ok(e instanceof AllotError);
      assert.equal(e.status, 422);
      assert.match(e.sentence, /Idempotency-Key/);
      return true;
    });
    assert.equal((await c.signup(9001, 4)).status, "WAITING", "the 422 changed nothing");
  });

  test("?wait= answers the result in the write's own round trip", async () => {
    const xs: Exchange[] = [];
    const cw = new Client(s.url, { token: s.token, wait: 30_000, onExchange: (x) => xs.push(x) });
    const r = await cw.join(9001, 5);
    assert.equal(r.outcome, "WAITING");
    assert.deepEqual(xs.map((x) => [x.method, x.path, x.status]), [["POST", "/v1/activities/9001/signups/5?wait=30s", 200]]);
  });

  test("without ?wait= the write is acked 202 and its result polled", async () => {
    const xs: Exchange[] = [];
    const sleeps: number[] = [];
    const cp = new Client(s.url, {
      token: s.token, wait: 0, onExchange: (x) => xs.push(x),
      sleep: (ms) => new Promise((r) => { sleeps.push(ms); setTimeout(r, ms); }),
    });
    const sub = await cp.submit({ op: "join", activity: 9001, user: 6 });
    assert.equal(sub.result, null);
    assert.match(sub.requestId, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    const r = await cp.wait(sub.requestId);
    assert.equal(r.request_id, sub.requestId);
    assert.equal(r.outcome, "WAITING");
    assert.equal(xs[0]?.status, 202);
    assert.ok(xs.length >= 2);
    for (const x of xs.slice(1)) assert.deepEqual([x.method, x.path, x.status], ["GET", `/v1/requests/${sub.requestId}`, 200]);
    assert.equal(sleeps.length, xs.length - 2, "a backoff after each pending poll");
    const again = await cp.poll(sub.requestId);
    assert.deepEqual(again, r);
  });

  test("a bad request: 400 with its sentence, nothing stored", async () => {
    await assert.rejects(c.open(9003, -1), (e: unknown) => {
      assert.ok(e instanceof AllotError);
      assert.equal(e.status, 400);
      assert.equal(e.sentence, "The capacity must be between 0 and 10000000.");
      return true;
    });
    await assert.rejects(c.activity(9003), (e: unknown) => e instanceof AllotError && e.notFound);
  });

  test("the notifier's webhook calls decode: promoted and held, keyed by event_id", async () => {
    const want = (ev: Event): boolean =>
      (ev.kind === "promoted" && ev.activity_id === 9001) || (ev.kind === "held" && ev.activity_id === 9002);
    let got: Array<{ ev: Event; key: string | undefined }> = [];
    for (let i = 0; got.length < 2; i++) {
      got = s.hooks.map((h) => ({ ev: decodeEvent(h.body), key: h.headers["idempotency-key"] as string | undefined })).filter((x) => want(x.ev));
      if (i > 300) assert.fail(`the webhook got ${s.hooks.length} calls in 30 s, not the promoted and held events: ${JSON.stringify(s.hooks.map((h) => h.body))}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const promoted = must(got.find((x) => x.ev.kind === "promoted"));
    assert.equal(promoted.key, promoted.ev.event_id);
    assert.equal(promoted.ev.user_id, 2);
    assert.equal(promoted.ev.request_id, must(cancelled).request_id);
    assert.equal(promoted.ev.seq, must(cancelled).seq);
    assert.equal(promoted.ev.held_until, undefined);
    const h = must(got.find((x) => x.ev.kind === "held"));
    assert.equal(h.key, h.ev.event_id);
    assert.equal(h.ev.user_id, 1);
    assert.equal(h.ev.request_id, must(held).request_id);
    assert.equal(Date.parse(must(h.ev.held_until)), Date.parse(must(must(held).held_until)));
  });
});
