import type { Event } from "./types.js";

/** Thrown by decodeEvent: the data is not an event a receiver can dedupe. */
export class MalformedEventError extends Error {
  override name = "MalformedEventError";
}

const fields: ReadonlyArray<readonly [keyof Event, "string" | "number"]> = [
  ["event_id", "string"],
  ["kind", "string"],
  ["activity_id", "number"],
  ["user_id", "number"],
  ["request_id", "string"],
  ["seq", "number"],
  ["index", "number"],
  ["at", "string"],
];

/**
 * Decodes an event message: the body of a notifier's webhook call (POSTed
 * with Idempotency-Key set to its event_id), or the data of a message on
 * alloc.evt.<activity>.<kind>. It checks that every field has its JSON type
 * and that event_id is a token a receiver can dedupe by (printable ASCII
 * without spaces, at most 255 bytes), as the Go client's DecodeEvent does.
 * A kind newer than this client passes through as it is.
 */
export function decodeEvent(data: string | Uint8Array): Event {
  let v: unknown;
  try {
    v = JSON.parse(typeof data === "string" ? data : new TextDecoder("utf-8", { fatal: true }).decode(data));
  } catch (e) {
    throw new MalformedEventError(`malformed event: ${(e as Error).message}`);
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    throw new MalformedEventError("malformed event: not a JSON object");
  }
  const o = v as Record<string, unknown>;
  for (const [name, type] of fields) {
    if (typeof o[name] !== type) {
      throw new MalformedEventError(o[name] === undefined ? `malformed event: no ${name}` : `malformed event: ${name} is not a ${type}`);
    }
  }
  const id = o["event_id"] as string;
  if (id === "" || id.length > 255 || !/^[\x21-\x7e]+$/.test(id)) {
    throw new MalformedEventError(`malformed event: event_id ${JSON.stringify(id)} is not a printable token of at most 255 bytes`);
  }
  for (const name of ["at", "held_until"] as const) {
    const t = o[name];
    if (t !== undefined && (typeof t !== "string" || Number.isNaN(Date.parse(t)))) {
      throw new MalformedEventError(`malformed event: ${name} is not a date-time`);
    }
  }
  return o as Event;
}
