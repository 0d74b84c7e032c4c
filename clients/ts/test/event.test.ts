// decodeEvent against a fixture of the events the allocator publishes and
// the notifier POSTs, and against bodies a receiver must refuse.
import { strict as assert } from "node:assert";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { decodeEvent, MalformedEventError, type Event, type EventKind } from "@allot/client";

const fixture = readFileSync(new URL("../../test/fixtures/events.json", import.meta.url), "utf8");
const events = JSON.parse(fixture) as unknown[];

test("the fixture's events decode, as text and as bytes, field for field", () => {
  const kinds: EventKind[] = [];
  for (const raw of events) {
    const text = JSON.stringify(raw);
    const ev: Event = decodeEvent(text);
    assert.deepEqual(ev, raw);
    assert.deepEqual(decodeEvent(new TextEncoder().encode(text)), raw);
    kinds.push(ev.kind);
    assert.equal(ev.held_until !== undefined, ev.kind === "held", `held_until on ${ev.kind}`);
  }
  assert.deepEqual(kinds, ["opened", "promoted", "held"]);
  const promoted = decodeEvent(JSON.stringify(events[1]));
  assert.equal(promoted.user_id, 2);
  assert.equal(promoted.seq, 4);
  assert.equal(promoted.index, 2);
  assert.equal(promoted.request_id, "7c1d3e5f-2a4b-4c6d-8e0f-1a2b3c4d5e6f");
  assert.equal(Date.parse(promoted.at), Date.UTC(2026, 11, 1, 10, 41, 7, 610));
});

test("a body a receiver cannot dedupe or read is refused with the reason", () => {
  const good = events[0] as Record<string, unknown>;
  const cases: Array<[string, string | Uint8Array, RegExp]> = [
    ["not JSON", "{", /malformed event: /],
    ["an array", "[]", /not a JSON object/],
    ["no event_id", JSON.stringify({ ...good, event_id: undefined }), /no event_id/],
    ["an empty event_id", JSON.stringify({ ...good, event_id: "" }), /event_id "" is not a printable token/],
    ["a space in event_id", JSON.stringify({ ...good, event_id: "a b" }), /is not a printable token/],
    ["a 256-byte event_id", JSON.stringify({ ...good, event_id: "x".repeat(256) }), /at most 255 bytes/],
    ["a string activity_id", JSON.stringify({ ...good, activity_id: "9001" }), /activity_id is not a number/],
    ["no seq", JSON.stringify({ ...good, seq: undefined }), /no seq/],
    ["a string index", JSON.stringify({ ...good, index: "0" }), /index is not a number/],
    ["a bad at", JSON.stringify({ ...good, at: "yesterday" }), /at is not a date-time/],
    ["a bad held_until", JSON.stringify({ ...good, held_until: 5 }), /held_until is not a date-time/],
    ["bytes that are not UTF-8", new Uint8Array([0x7b, 0xff, 0x7d]), /malformed event: /],
  ];
  for (const [name, body, want] of cases) {
    assert.throws(() => decodeEvent(body), (e: unknown) => {
      assert.ok(e instanceof MalformedEventError, `${name}: ${String(e)}`);
      assert.match((e as Error).message, want, name);
      return true;
    }, name);
  }
  assert.equal(decodeEvent(JSON.stringify({ ...good, event_id: "x".repeat(255) })).event_id.length, 255);
});
