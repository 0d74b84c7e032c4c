// The client's retries, backoff and polling against a scripted local HTTP
// server: each test lists the answers the server gives in order, and the
// client's injected sleep records the waits instead of sleeping, so the
// delays are asserted exactly and no test depends on the wall clock.
import { strict as assert } from "node:assert";
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, beforeEach, describe, test } from "node:test";

import { AllotError, Client, type ClientOptions, type Exchange, type Result } from "@allot/client";

interface Answer {
  status: number;
  headers?: Record<string, string>;
  body?: unknown;
  /** Close the connection without answering: a transport error. */
  drop?: boolean;
  /** Runs before the answer is sent (e.g. to move the fake clock). */
  before?: () => void;
}

interface Seen {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  body: string;
}

let server: Server;
let base = "";
let script: Answer[] = [];
let seen: Seen[] = [];

before(async () => {
  server = createServer((req, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (c: string) => (body += c));
    req.on("end", () => {
      seen.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body });
      const a = script.shift();
      if (a === undefined) {
        res.writeHead(599, { "Content-Type": "application/json" }).end(JSON.stringify({ error: "the script has no more answers." }));
        return;
      }
      a.before?.();
      if (a.drop) {
        req.socket.destroy();
        return;
      }
      res.writeHead(a.status, { "Content-Type": "application/json", ...a.headers });
      res.end(a.body === undefined ? "" : JSON.stringify(a.body));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  server.closeAllConnections();
  await new Promise<void>((resolve, reject) => server.close((err) => (err ? reject(err) : resolve())));
});

beforeEach(() => {
  script = [];
  seen = [];
});

const rid = "0a1b2c3d-4e5f-4061-8273-8495a6b7c8d9";

function done(extra: Partial<Result> = {}): Result {
  return {
    request_id: rid, state: "done", op: "join", activity_id: 7, user_id: 3, outcome: "CONFIRMED",
    status: "CONFIRMED", position: null, promoted_user_id: null, seq: 12, index: 0, applied_at: "2026-12-01T10:00:00Z", ...extra,
  };
}
const pending = { request_id: rid, state: "pending" };
const overloaded = { error: "Too many requests are waiting for the broker; retry after the time in Retry-After." };

/** A client whose waits are recorded in sleeps; random 0.5 makes the backoff 3/4 of its bound. */
function scripted(opts: ClientOptions = {}): { c: Client; sleeps: number[]; exchanges: Exchange[] } {
  const sleeps: number[] = [];
  const exchanges: Exchange[] = [];
  const c = new Client(base, {
    sleep: async (ms) => void sleeps.push(ms),
    random: () => 0.5,
    onExchange: (x) => exchanges.push(x),
    ...opts,
  });
  return { c, sleeps, exchanges };
}

describe("retries", () => {
  test("429 and 503 wait exactly their Retry-After, resending the same key and body", async () => {
    script = [
      { status: 429, headers: { "Retry-After": "3" }, body: overloaded },
      { status: 503, headers: { "Retry-After": "1" }, body: overloaded },
      { status: 200, body: done({ op: "open", user_id: 0, outcome: "OPENED", status: null, capacity: 5 }) },
    ];
    const { c, sleeps, exchanges } = scripted();
    const r = await c.open(7, 5, { hold: 90_000 });
    assert.equal(r.outcome, "OPENED");
    assert.deepEqual(sleeps, [3000, 1000]);
    assert.equal(seen.length, 3);
    const key = seen[0]!.headers["idempotency-key"];
    assert.match(String(key), /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    for (const s of seen) {
      assert.equal(s.method, "PUT");
      assert.equal(s.url, "/v1/activities/7?wait=10s");
      assert.equal(s.headers["idempotency-key"], key);
      assert.equal(s.headers["content-type"], "application/json");
      assert.deepEqual(JSON.parse(s.body), { capacity: 5, hold: "90s" });
    }
    assert.deepEqual(exchanges.map((x) => [x.status, x.retry]), [[429, true], [503, true], [200, false]]);
  });

  test("an HTTP-date Retry-After is waited until that date by the injected clock", async () => {
    const now = Date.parse("2026-12-01T10:00:00Z");
    script = [
      { status: 503, headers: { "Retry-After": new Date(now + 7000).toUTCString() }, body: overloaded },
      { status: 200, body: done() },
    ];
    const { c, sleeps } = scripted({ now: () => now });
    await c.join(7, 3);
    assert.deepEqual(sleeps, [7000]);
  });

  test("without Retry-After a 5xx backs off exponentially from minBackoff up to maxBackoff", async () => {
    script = [
      { status: 500, body: { error: "The server failed." } },
      { status: 502, body: "bad gateway" },
      { status: 503, body: overloaded },
      { status: 503, headers: { "Retry-After": "0" }, body: overloaded },
      { status: 200, body: done() },
    ];
    const { c, sleeps } = scripted({ minBackoff: 100, maxBackoff: 300 });
    await c.join(7, 3);
    // Bounds 100, 200, 300 (capped), 300; random 0.5 waits 3/4 of each.
    assert.deepEqual(sleeps, [75, 150, 225, 225]);
  });

  test("the jitter spans the upper half of each bound", async () => {
    for (const [random, want] of [[0, 50], [0.999, 99.95]] as const) {
      script = [{ status: 500, body: { error: "The server failed." } }, { status: 200, body: done() }];
      const { c, sleeps } = scripted({ minBackoff: 100, random: () => random });
      await c.join(7, 3);
      assert.equal(sleeps.length, 1);
      assert.ok(Math.abs(sleeps[0]! - want) < 1e-9, `random ${random}: slept ${sleeps[0]}, want ${want}`);
    }
  });

  test("the retries are bounded; the last answer is the error, with its Retry-After", async () => {
    script = Array.from({ length: 3 }, () => ({ status: 503, headers: { "Retry-After": "2" }, body: overloaded }));
    const { c, sleeps } = scripted({ retries: 2 });
    await assert.rejects(c.claim(7, 3), (e: unknown) => {
      assert.ok(e instanceof AllotError);
      assert.equal(e.status, 503);
      assert.equal(e.retryAfter, 2000);
      assert.equal(e.sentence, overloaded.error);
      assert.equal(e.message, `POST /v1/activities/7/claims/3?wait=10s: HTTP 503: ${overloaded.error}`);
      return true;
    });
    assert.equal(seen.length, 3);
    assert.deepEqual(sleeps, [2000, 2000]);
  });

  test("a 4xx is not retried: its status and sentence come back at once", async () => {
    script = [{ status: 422, body: { error: "Idempotency-Key is already bound to another op or path." } }];
    const { c, sleeps } = scripted();
    await assert.rejects(c.cancel(7, 3, { key: "k-1" }), (e: unknown) => {
      assert.ok(e instanceof AllotError);
      assert.equal(e.status, 422);
      assert.equal(e.sentence, "Idempotency-Key is already bound to another op or path.");
      assert.equal(e.temporary, false);
      return true;
    });
    assert.equal(seen.length, 1);
    assert.equal(seen[0]!.headers["idempotency-key"], "k-1");
    assert.equal(seen[0]!.method, "DELETE");
    assert.deepEqual(sleeps, []);
  });

  test("a dropped connection is resent with the same key, up to netRetries", async () => {
    script = [{ status: 0, drop: true }, { status: 0, drop: true }, { status: 200, body: done() }];
    const ok = scripted({ minBackoff: 40 });
    await ok.c.join(7, 3);
    assert.equal(seen.length, 3);
    assert.equal(new Set(seen.map((s) => s.headers["idempotency-key"])).size, 1);
    assert.deepEqual(ok.sleeps, [30, 60]);
    assert.deepEqual(ok.exchanges.map((x) => [x.status, x.retry]), [[0, true], [0, true], [200, false]]);

    seen = [];
    script = [{ status: 0, drop: true }, { status: 0, drop: true }, { status: 200, body: done() }];
    const bounded = scripted({ netRetries: 1 });
    await assert.rejects(bounded.c.join(7, 3), (e: unknown) => !(e instanceof AllotError));
    assert.equal(seen.length, 2);
    script = [];
  });

  test("an aborted signal stops the retries", async () => {
    script = [{ status: 503, headers: { "Retry-After": "5" }, body: overloaded }, { status: 200, body: done() }];
    const ac = new AbortController();
    const c = new Client(base, {
      sleep: async (ms, signal) => {
        assert.equal(ms, 5000);
        ac.abort(new Error("the user left"));
        if (signal?.aborted) throw signal.reason;
      },
    });
    await assert.rejects(c.join(7, 3, { signal: ac.signal }), /the user left/);
    assert.equal(seen.length, 1);
    script = [];
  });
});

describe("waiting", () => {
  test("a 202 is followed by polls; one answered early backs off, one the server held does not", async () => {
    let clock = 0;
    script = [
      { status: 202, headers: { Location: `/v1/requests/${rid}` }, body: pending },
      { status: 200, body: pending }, // answered at once: back off
      { status: 200, body: pending, before: () => (clock += 6000) }, // held 6 s of the 10 s wait: poll again at once
      { status: 200, body: pending }, // early again: the backoff starts over
      { status: 200, body: done({ outcome: "WAITING", status: "WAITING", position: 4 }) },
    ];
    const { c, sleeps } = scripted({ now: () => clock, minBackoff: 100 });
    const r = await c.join(7, 3);
    assert.equal(r.outcome, "WAITING");
    assert.equal(r.position, 4);
    assert.deepEqual(seen.map((s) => `${s.method} ${s.url}`), [
      "POST /v1/activities/7/signups/3?wait=10s",
      `GET /v1/requests/${rid}?wait=10s`,
      `GET /v1/requests/${rid}?wait=10s`,
      `GET /v1/requests/${rid}?wait=10s`,
      `GET /v1/requests/${rid}?wait=10s`,
    ]);
    assert.equal(seen[1]!.headers["idempotency-key"], undefined, "a poll carries no key");
    assert.deepEqual(sleeps, [75, 75]);
  });

  test("with wait 0 nothing asks the server to hold, and every pending poll backs off", async () => {
    script = [
      { status: 202, body: pending },
      { status: 200, body: pending },
      { status: 200, body: pending },
      { status: 200, body: done() },
    ];
    const { c, sleeps } = scripted({ wait: 0, minBackoff: 100 });
    const s = await c.submit({ op: "join", activity: 7, user: 3 });
    assert.deepEqual(s, { requestId: rid, result: null });
    const r = await c.wait(s.requestId);
    assert.equal(r.state, "done");
    assert.deepEqual(seen.map((x) => x.url), ["/v1/activities/7/signups/3", `/v1/requests/${rid}`, `/v1/requests/${rid}`, `/v1/requests/${rid}`]);
    assert.deepEqual(sleeps, [75, 150]);
  });

  test("a 202 without a request_id is an error, not a poll of nothing", async () => {
    script = [{ status: 202, body: {} }];
    const { c } = scripted();
    await assert.rejects(c.join(7, 3), /HTTP 202 without a request_id/);
  });
});

describe("requests", () => {
  test("the bearer token is sent with every request, a function's asked each time", async () => {
    script = [{ status: 200, body: done() }, { status: 200, body: done() }];
    let n = 0;
    await scripted({ token: "tok-a" }).c.join(7, 3);
    await scripted({ token: () => `tok-${++n}` }).c.confirm(7, 3);
    assert.deepEqual(seen.map((s) => [s.url, s.headers["authorization"]]), [
      ["/v1/activities/7/signups/3?wait=10s", "Bearer tok-a"],
      ["/v1/activities/7/signups/3/confirm?wait=10s", "Bearer tok-1"],
    ]);
  });

  test("a token function that fails fails the call at once, sending nothing", async () => {
    const { c, sleeps } = scripted({ token: () => Promise.reject(new Error("signed out")) });
    await assert.rejects(c.join(7, 3), /signed out/);
    assert.equal(seen.length, 0);
    assert.deepEqual(sleeps, []);
  });

  test("ids are checked before anything is sent; a bigint reaches past 2^53", async () => {
    const { c } = scripted();
    await assert.rejects(c.join(0, 3), RangeError);
    await assert.rejects(c.join(7, 2 ** 53), RangeError);
    await assert.rejects(c.join(7, 1.5), RangeError);
    await assert.rejects(c.join(2n ** 63n, 1), RangeError);
    assert.equal(seen.length, 0);
    script = [{ status: 200, body: done() }];
    await c.claim(9223372036854775807n, 3);
    assert.equal(seen[0]!.url, "/v1/activities/9223372036854775807/claims/3?wait=10s");
  });

  test("a 2xx body that is not JSON is an error", async () => {
    script = [{ status: 200, before: () => undefined }];
    await assert.rejects(scripted().c.activity(7), /HTTP 200 with a body that is not JSON/);
  });

  test("a base URL that is not http(s) is refused", () => {
    assert.throws(() => new Client("ftp://x"), TypeError);
    assert.throws(() => new Client("localhost:8080"), TypeError);
    assert.equal(new Client("http://h:1/").baseURL, "http://h:1");
  });
});
