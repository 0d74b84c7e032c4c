// The API's types, named. Every one is taken from the types openapi-typescript
// generates from api/openapi.yaml (src/openapi.ts, `npm run generate`), so a
// word or field the spec changes changes here too; the spec itself is checked
// against the server's router by api/openapi_test.go.
import type { components } from "./openapi.js";

type Schemas = components["schemas"];

/** The operation a request carries ("expire" is never sent by clients; its results are readable). */
export type Op = Schemas["Op"];
/** The result of applying a request: OPENED, RESIZED, REJECTED, CONFIRMED, WAITING, … (see api/openapi.yaml, Outcome). */
export type Outcome = Schemas["Outcome"];
/** A signup's status: CONFIRMED, WAITING, CANCELLED or HELD. */
export type Status = Schemas["Status"];
/** The kind of an event, the last token of its subject alloc.evt.<activity>.<kind>. */
export type EventKind = Schemas["EventKind"];
/** The answer to a write that is stored but not yet applied (HTTP 202), and the poll answer while it is pending. */
export type Ack = Schemas["Ack"];
/** A request's final, recorded result. Ids are JSON numbers: exact up to Number.MAX_SAFE_INTEGER. */
export type Result = Schemas["Result"];
/** An activity's counters, read in one snapshot. */
export type ActivityState = Schemas["ActivityState"];
/** One user's signup in one activity. */
export type SignupState = Schemas["SignupState"];
/**
 * An event: the message on alloc.evt.<activity>.<kind>, and the body the
 * notifier POSTs to a webhook with Idempotency-Key set to event_id. Delivery
 * is at least once: a receiver dedupes by event_id.
 */
export type Event = Schemas["Event"];
/** The server's error body: one sentence. */
export type ErrorBody = Schemas["Error"];

/** Request states as a polling client sees them. */
export type State = Ack["state"] | Result["state"];

/** An activity or user id: a positive integer (a number up to Number.MAX_SAFE_INTEGER, or a bigint up to 2^63-1). */
export type ID = number | bigint;
