// Command token mints a development bearer token signed with
// ALLOT_AUTH_HS256_KEY (and carrying ALLOT_AUTH_ISSUER and
// ALLOT_AUTH_AUDIENCE when set), for curl, loadgen and the operator page
// against an ingest that requires tokens. `make token USER=1 SCOPE=allot:admin`
// runs it. Production tokens come from an identity provider.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/binaries"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sub := fs.String("user", "", "the token's sub: a user id, or any name for a token with a scope")
	scope := fs.String("scope", "", "space- or comma-separated scopes: allot:admin, allot:operator")
	ttl := fs.Duration("ttl", 12*time.Hour, "how long the token is valid")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	env := binaries.Getenv[binaries.Token]()
	key := env.AuthHS256Key
	if len(key) < auth.MinHS256Key {
		fmt.Fprintf(stderr, "token: ALLOT_AUTH_HS256_KEY must be set to the ingest's key, at least %d bytes\n", auth.MinHS256Key)
		return 2
	}
	scopes := strings.FieldsFunc(*scope, func(r rune) bool { return r == ' ' || r == ',' })
	if *sub == "" {
		if len(scopes) == 0 {
			fmt.Fprintln(stderr, "token: -user is required (a user id), or -scope with a service name in -user")
			return 2
		}
		*sub = "dev"
	}
	tok, err := auth.MintHS256([]byte(key), auth.Claims{
		Subject: *sub, Scopes: scopes, TTL: *ttl,
		Issuer: env.AuthIssuer, Audience: env.AuthAudience,
	})
	if err != nil {
		fmt.Fprintf(stderr, "token: %v\n", err)
		return 2
	}
	fmt.Fprintln(stdout, tok)
	return 0
}
