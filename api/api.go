// Package api publishes allot's HTTP API description: openapi.yaml
// (OpenAPI 3.1), whose components also describe the event and result
// messages the allocator publishes. The tests in this package drive the real
// ingest router through every route and status and validate each request
// and response, and each published message, against it.
package api

import _ "embed"

// OpenAPI is api/openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte
