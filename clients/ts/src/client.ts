// The client of allot's HTTP API (api/openapi.yaml), with the Go client's
// semantics (client/client.go): one Idempotency-Key per logical attempt,
// sent again on every retry of it, so a write is stored and applied once
// however often the network or the server makes the client resend it; the
// server's ?wait= first, then polling with backoff; Retry-After honoured on
// 429 and 503. It uses only what browsers and Node 20 both have (fetch,
// AbortSignal, crypto, setTimeout).
import type { Ack, ActivityState, ErrorBody, ID, Op, Result, SignupState } from "./types.js";

/** Sleeps ms milliseconds, or rejects when signal aborts. Injectable for tests. */
export type Sleep = (ms: number, signal?: AbortSignal) => Promise<void>;

/** One HTTP round trip, for the onExchange option (metrics, load reports). */
export interface Exchange {
  method: string;
  path: string;
  /** The HTTP status, 0 when the round trip failed (error). */
  status: number;
  error?: unknown;
  /** True when the client will send the request again. */
  retry: boolean;
  /** The round trip's duration in milliseconds, by the client's clock. */
  elapsed: number;
}

export interface ClientOptions {
  /** Sent as Authorization: Bearer <token>; a function is asked before every request (for tokens that refresh). */
  token?: string | (() => string | Promise<string>);
  /** The ?wait= of writes and polls in milliseconds: how long the server holds an answer for the result (default 10000; the server caps it at 30 s). 0 sends none. */
  wait?: number;
  /** Attempts of one call after a 429, a 5xx or a transport error (default 10). */
  retries?: number;
  /** Attempts after a transport error, within retries (default 3). The same key makes a resend safe. */
  netRetries?: number;
  /** The jittered exponential backoff's first and largest wait in milliseconds (default 50 and 5000), used when the server sent no Retry-After. */
  minBackoff?: number;
  maxBackoff?: number;
  /** Called after every HTTP round trip. */
  onExchange?: (x: Exchange) => void;
  /** The fetch to use (default: the global one). */
  fetch?: typeof fetch;
  /** How the client waits out a Retry-After or a backoff (default: setTimeout). */
  sleep?: Sleep;
  /** The clock in milliseconds (default Date.now): for an HTTP-date Retry-After and a poll's duration. */
  now?: () => number;
  /** A number in [0, 1) for the backoff's jitter (default Math.random). */
  random?: () => number;
}

/** Per-call options. */
export interface CallOptions {
  /** Aborts the call, its retries and its polling. */
  signal?: AbortSignal;
}

/** Per-write options. */
export interface WriteOptions extends CallOptions {
  /** The Idempotency-Key; absent means a fresh newKey(). Pass the same key to resubmit one logical attempt. */
  key?: string;
}

/** One write request, for submit and do. */
export interface Write {
  op: Exclude<Op, "expire">;
  activity: ID;
  /** Not for open. */
  user?: ID;
  /** Open only: the number of seats. */
  capacity?: number;
  /** Open only: how long each seat taken from now on is held until confirmed, in milliseconds (0 or absent: no holds; at most 168 h). */
  hold?: number;
  /** The Idempotency-Key; absent means a fresh newKey(). */
  key?: string;
}

/** What submit answers: the request's id, and its result when ?wait= saw it applied. */
export interface Submission {
  requestId: string;
  result: Result | null;
}

/**
 * An answer the server gave that is not a success: the status and the
 * server's one sentence.
 */
export class AllotError extends Error {
  override name = "AllotError";
  readonly method: string;
  readonly path: string;
  readonly status: number;
  /** The server's sentence (the error body's `error`), or the start of a body that is not one. */
  readonly sentence: string;
  /** The Retry-After of a 429 or 503 in milliseconds, 0 if none. */
  readonly retryAfter: number;

  constructor(method: string, path: string, status: number, sentence: string, retryAfter = 0) {
    super(`${method} ${path}: HTTP ${status}: ${sentence}`);
    this.method = method;
    this.path = path;
    this.status = status;
    this.sentence = sentence;
    this.retryAfter = retryAfter;
  }

  /** No such activity, signup or request. */
  get notFound(): boolean {
    return this.status === 404;
  }

  /** The same request may succeed later: nothing was stored (429, 503) or the server failed (5xx). */
  get temporary(): boolean {
    return this.status === 429 || this.status >= 500;
  }
}

/**
 * A fresh idempotency key: a random UUID. Use one per logical attempt (one
 * user's tap) and send it again on each retry of that attempt.
 */
export function newKey(): string {
  const c = globalThis.crypto;
  if (typeof c.randomUUID === "function") return c.randomUUID();
  // Browsers outside a secure context have getRandomValues only.
  const b = c.getRandomValues(new Uint8Array(16));
  b[6] = (b[6]! & 0x0f) | 0x40;
  b[8] = (b[8]! & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** Reports whether a poll answer is the final result. */
export function isDone(r: Ack | Result): r is Result {
  return r.state === "done";
}

const maxID = 2n ** 63n - 1n;

function idString(what: string, id: ID): string {
  if (typeof id === "bigint" ? id < 1n || id > maxID : !Number.isSafeInteger(id) || id < 1) {
    throw new RangeError(`${what} id ${String(id)} is not a positive integer${typeof id === "number" ? " up to Number.MAX_SAFE_INTEGER (pass a bigint beyond)" : " below 2^63"}`);
  }
  return String(id);
}

function count(what: string, v: number): number {
  if (!Number.isInteger(v) || v < 0) throw new RangeError(`${what} must be a non-negative whole number, got ${v}`);
  return v;
}

function milliseconds(what: string, v: number): number {
  if (!Number.isInteger(v) || v < 0) throw new RangeError(`${what} must be a non-negative whole number of milliseconds, got ${v}`);
  return v;
}

/** A duration in milliseconds as the server reads it (a Go duration). */
function duration(ms: number): string {
  return ms % 1000 === 0 ? `${ms / 1000}s` : `${ms}ms`;
}

function sleepTimeout(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Talks to one ingest endpoint. Safe for concurrent use. */
export class Client {
  readonly baseURL: string;
  readonly #token: ClientOptions["token"];
  readonly #wait: number;
  readonly #retries: number;
  readonly #netRetries: number;
  readonly #minBackoff: number;
  readonly #maxBackoff: number;
  readonly #onExchange: ((x: Exchange) => void) | undefined;
  readonly #fetch: typeof fetch;
  readonly #sleep: Sleep;
  readonly #now: () => number;
  readonly #random: () => number;

  /** A client of the ingest API at baseURL (e.g. http://localhost:8080). */
  constructor(baseURL: string, opts: ClientOptions = {}) {
    let u: URL;
    try {
      u = new URL(baseURL);
    } catch {
      throw new TypeError(`base URL ${JSON.stringify(baseURL)} is not an http(s) URL`);
    }
    if ((u.protocol !== "http:" && u.protocol !== "https:") || u.host === "") {
      throw new TypeError(`base URL ${JSON.stringify(baseURL)} is not an http(s) URL`);
    }
    this.baseURL = baseURL.replace(/\/+$/, "");
    this.#token = opts.token;
    this.#wait = milliseconds("wait", opts.wait ?? 10_000);
    this.#retries = count("retries", opts.retries ?? 10);
    this.#netRetries = count("netRetries", opts.netRetries ?? 3);
    this.#minBackoff = milliseconds("minBackoff", opts.minBackoff ?? 50);
    this.#maxBackoff = milliseconds("maxBackoff", opts.maxBackoff ?? 5_000);
    this.#onExchange = opts.onExchange;
    // Called as a function, not a method of opts: browsers refuse a fetch
    // whose this is not the window.
    const f = opts.fetch;
    this.#fetch = f ? (input, init) => f(input, init) : (input, init) => globalThis.fetch(input, init);
    this.#sleep = opts.sleep ?? sleepTimeout;
    this.#now = opts.now ?? Date.now;
    this.#random = opts.random ?? Math.random;
  }

  /** Opens activity with capacity seats, or resizes it, and waits for the result (OPENED, RESIZED or REJECTED). hold (ms) holds each seat taken from now on until its user confirms it. */
  open(activity: ID, capacity: number, opts: WriteOptions & { hold?: number } = {}): Promise<Result> {
    const w: Write = { op: "open", activity, capacity };
    if (opts.hold !== undefined) w.hold = opts.hold;
    return this.do(withKey(w, opts), opts);
  }

  /** Signs user up for activity and waits for the result (CONFIRMED, or HELD with held_until under a hold; WAITING with a position, ALREADY_CONFIRMED, ALREADY_WAITING or NO_SUCH_ACTIVITY). */
  join(activity: ID, user: ID, opts: WriteOptions = {}): Promise<Result> {
    return this.do(withKey({ op: "join", activity, user }, opts), opts);
  }

  /** Cancels user's signup and waits for the result (CANCELLED, with promoted_user_id if a waiter took the seat, or NOT_SIGNED_UP). */
  cancel(activity: ID, user: ID, opts: WriteOptions = {}): Promise<Result> {
    return this.do(withKey({ op: "cancel", activity, user }, opts), opts);
  }

  /** Claims a seat for user and waits for the result (GRANTED, or HELD under a hold; SOLD_OUT, ALREADY_OWNED, ALREADY_WAITING or NO_SUCH_ACTIVITY). */
  claim(activity: ID, user: ID, opts: WriteOptions = {}): Promise<Result> {
    return this.do(withKey({ op: "claim", activity, user }, opts), opts);
  }

  /** Confirms the seat user holds under the activity's hold and waits for the result (CONFIRMED; ALREADY_CONFIRMED, NOT_HELD, HOLD_EXPIRED or NO_SUCH_ACTIVITY). */
  confirm(activity: ID, user: ID, opts: WriteOptions = {}): Promise<Result> {
    return this.do(withKey({ op: "confirm", activity, user }, opts), opts);
  }

  /** Submits w and waits for its final result. */
  async do(w: Write, opts: CallOptions = {}): Promise<Result> {
    const s = await this.submit(w, opts);
    return s.result ?? this.wait(s.requestId, opts);
  }

  /**
   * Sends w once logically (retrying with the same key as needed) and
   * answers its result when the server saw it applied within the wait, else
   * the id of the stored request, whose result wait() follows.
   */
  async submit(w: Write, opts: CallOptions = {}): Promise<Submission> {
    const { method, path, body } = route(w);
    const key = w.key ?? newKey();
    const { status, data } = await this.#call<Ack | Result>(method, path + this.#waitQuery(this.#wait), key, body, opts.signal);
    if (status === 200 && isDone(data)) return { requestId: data.request_id, result: data };
    if (typeof data.request_id !== "string" || data.request_id === "") {
      throw new Error(`${method} ${path}: HTTP ${status} without a request_id`);
    }
    return { requestId: data.request_id, result: null };
  }

  /** Reads the state of request id once, the server holding the answer up to wait ms for the result. */
  async poll(id: string, wait = 0, opts: CallOptions = {}): Promise<Ack | Result> {
    const path = `/v1/requests/${encodeURIComponent(id)}${this.#waitQuery(milliseconds("wait", wait))}`;
    return (await this.#call<Ack | Result>("GET", path, "", undefined, opts.signal)).data;
  }

  /**
   * Follows request id until its result is final or the signal aborts: each
   * poll is held by the server up to the client's wait; a poll answered
   * pending early (a server with a shorter wait) is followed after a backoff.
   */
  async wait(id: string, opts: CallOptions = {}): Promise<Result> {
    for (let attempt = 0; ; attempt++) {
      const start = this.#now();
      const r = await this.poll(id, this.#wait, opts);
      if (isDone(r)) return r;
      if (this.#wait <= 0 || this.#now() - start < this.#wait / 2) {
        await this.#sleep(this.#backoff(attempt), opts.signal);
      } else {
        attempt = -1; // the server held the poll: no backoff needed
      }
    }
  }

  /** Reads activity's state; one never opened is an AllotError with notFound. */
  async activity(activity: ID, opts: CallOptions = {}): Promise<ActivityState> {
    return (await this.#call<ActivityState>("GET", `/v1/activities/${idString("activity", activity)}`, "", undefined, opts.signal)).data;
  }

  /** Reads user's signup in activity; one that never was is an AllotError with notFound. */
  async signup(activity: ID, user: ID, opts: CallOptions = {}): Promise<SignupState> {
    const path = `/v1/activities/${idString("activity", activity)}/signups/${idString("user", user)}`;
    return (await this.#call<SignupState>("GET", path, "", undefined, opts.signal)).data;
  }

  #waitQuery(wait: number): string {
    return wait > 0 ? `?wait=${duration(wait)}` : "";
  }

  /**
   * One logical request: retries transport errors, 429 and 5xx with the
   * same key and body, honouring Retry-After, and decodes a 2xx body.
   */
  async #call<T>(method: string, path: string, key: string, body: string | undefined, signal: AbortSignal | undefined): Promise<{ status: number; data: T }> {
    let netErrs = 0;
    for (let attempt = 0; ; attempt++) {
      const start = this.#now();
      let status = 0;
      let text = "";
      let retryAfter = 0;
      let err: unknown;
      // Asked outside the try: a token that cannot be had is no transport error to retry.
      const token = typeof this.#token === "function" ? await this.#token() : this.#token;
      try {
        ({ status, text, retryAfter } = await this.#roundTrip(method, path, key, token, body, signal));
      } catch (e) {
        err = e;
      }
      const elapsed = this.#now() - start;
      let retry = attempt < this.#retries && !signal?.aborted;
      if (err !== undefined) {
        // Sent or not, the same key makes a resend safe.
        netErrs++;
        retry &&= netErrs <= this.#netRetries;
      } else if (status >= 200 && status < 300) {
        this.#onExchange?.({ method, path, status, retry: false, elapsed });
        let data: T;
        try {
          data = JSON.parse(text) as T;
        } catch (e) {
          throw new Error(`${method} ${path}: HTTP ${status} with a body that is not JSON: ${(e as Error).message}`);
        }
        return { status, data };
      } else {
        const apiErr = new AllotError(method, path, status, sentence(text), retryAfter);
        err = apiErr;
        retry &&= apiErr.temporary;
      }
      this.#onExchange?.({ method, path, status, error: err, retry, elapsed });
      if (!retry) throw err;
      await this.#sleep(retryAfter > 0 ? retryAfter : this.#backoff(attempt), signal);
    }
  }

  async #roundTrip(method: string, path: string, key: string, token: string | undefined, body: string | undefined, signal: AbortSignal | undefined): Promise<{ status: number; text: string; retryAfter: number }> {
    const headers: Record<string, string> = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (key !== "") headers["Idempotency-Key"] = key;
    if (token) headers["Authorization"] = `Bearer ${token}`;
    const init: RequestInit = { method, headers };
    if (body !== undefined) init.body = body;
    if (signal) init.signal = signal;
    const res = await this.#fetch(this.baseURL + path, init);
    const text = await res.text();
    return { status: res.status, text, retryAfter: this.#retryAfter(res.headers.get("Retry-After")) };
  }

  /** Retry-After in milliseconds: seconds (the form ingest sends) or an HTTP date. */
  #retryAfter(v: string | null): number {
    if (v === null || v === "") return 0;
    if (/^[0-9]+$/.test(v)) return Number(v) * 1000;
    const t = Date.parse(v);
    return Number.isNaN(t) ? 0 : Math.max(0, t - this.#now());
  }

  /** The attempt-th wait: exponential from minBackoff, capped at maxBackoff, with full jitter over its upper half. */
  #backoff(attempt: number): number {
    const d = Math.min(this.#minBackoff * 2 ** Math.min(attempt, 30), this.#maxBackoff);
    return d / 2 + this.#random() * (d / 2);
  }
}

function withKey(w: Write, opts: WriteOptions): Write {
  if (opts.key !== undefined) w.key = opts.key;
  return w;
}

function route(w: Write): { method: string; path: string; body?: string } {
  const a = `/v1/activities/${idString("activity", w.activity)}`;
  if (w.op === "open") {
    if (w.capacity === undefined) throw new RangeError("op open needs a capacity");
    const body: { capacity: number; hold?: string } = { capacity: w.capacity };
    if (w.hold !== undefined && milliseconds("hold", w.hold) !== 0) body.hold = duration(w.hold);
    return { method: "PUT", path: a, body: JSON.stringify(body) };
  }
  if (w.user === undefined) throw new RangeError(`op ${w.op} needs a user id`);
  const u = idString("user", w.user);
  switch (w.op) {
    case "join":
      return { method: "POST", path: `${a}/signups/${u}` };
    case "cancel":
      return { method: "DELETE", path: `${a}/signups/${u}` };
    case "claim":
      return { method: "POST", path: `${a}/claims/${u}` };
    case "confirm":
      return { method: "POST", path: `${a}/signups/${u}/confirm` };
  }
  throw new RangeError(`unknown op ${JSON.stringify(w.op)}`);
}

function sentence(text: string): string {
  try {
    const e = JSON.parse(text) as Partial<ErrorBody>;
    if (typeof e.error === "string" && e.error !== "") return e.error;
  } catch {
    // not the error body: say what came
  }
  const s = text.trim();
  return s.length > 120 ? s.slice(0, 120) : s;
}
