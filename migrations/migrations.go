// Package migrations holds allot's numbered SQL migrations, embedded so that
// every binary carries the schema it was built against.
package migrations

import "embed"

// FS holds the *.sql files, applied in name order.
//
//go:embed *.sql
var FS embed.FS
