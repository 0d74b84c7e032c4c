// @allot/client: the TypeScript client of allot's HTTP API. See README.md.
export { AllotError, Client, isDone, newKey } from "./client.js";
export type { CallOptions, ClientOptions, Exchange, Sleep, Submission, Write, WriteOptions } from "./client.js";
export { decodeEvent, MalformedEventError } from "./event.js";
export type * from "./types.js";
export type { components, paths, operations } from "./openapi.js";
