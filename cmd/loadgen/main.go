// Command loadgen is the launch-night rehearsal: it opens an activity, fires
// a burst of requests at allot's HTTP API (or at a baseline serving the same
// routes), waits for every final result, prints the figures and checks the
// invariants. Exit 0 when the verdict passes, 1 when it fails, 2 on usage
// errors or when the rehearsal cannot run.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/buildinfo"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/loadgen"
)

const binary = "loadgen"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, term.IsTerminal(int(os.Stderr.Fd()))))
}

// options are the command line: the rehearsal (loadgen.Config, which the
// flags set), what it runs with besides (per-user tokens), and how the
// command shows it (-json, -progress, -timeout).
type options struct {
	cfg       loadgen.Config
	userToken func(user int64) string
	json      bool
	progress  bool
	timeout   time.Duration
}

// errUsage marks a command-line mistake (exit 2 after the usage text).
var errUsage = errors.New("usage")

// defaultURL is the ingest of `make run` (Config.BaseURL's default), or
// ALLOT_HTTP_ADDR's when set.
func defaultURL(def string) string {
	addr := binaries.Getenv[binaries.Loadgen]().HTTPAddr
	if addr == "" {
		return def
	}
	if strings.HasPrefix(addr, ":") {
		addr = "127.0.0.1" + addr
	}
	return "http://" + addr
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet(binary, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s -url URL -activity A -capacity N -n REQUESTS -users U -c CONC [-mix claim=1,join=0,cancel=0,confirm=0] [-hold D -no-show F] [-json]\n", binary)
		fs.PrintDefaults()
	}
	o.cfg = config.Defaults[loadgen.Config]()
	c := &o.cfg
	// The flags override the Config's fields, whose defaults are theirs.
	fs.StringVar(&c.BaseURL, "url", defaultURL(c.BaseURL), "base URL of the API (default from ALLOT_HTTP_ADDR)")
	fs.Int64Var(&c.Activity, "activity", c.Activity, "activity id to open and fire at (required)")
	fs.Int64Var(&c.Capacity, "capacity", c.Capacity, "capacity to open the activity with (required unless -no-open)")
	fs.IntVar(&c.Requests, "n", c.Requests, "number of requests in the burst")
	fs.IntVar(&c.Users, "users", c.Users, "distinct users; fewer than -n means repeat taps (default -n)")
	fs.IntVar(&c.Concurrency, "c", c.Concurrency, "concurrent workers")
	fs.Var(&c.Mix, "mix", "op weights, e.g. claim=1,join=0,cancel=0 (confirm=W adds confirm taps)")
	fs.DurationVar(&c.Wait, "wait", c.Wait, "?wait= of each write and poll")
	fs.DurationVar(&c.OpenWait, "open-wait", c.OpenWait, "?wait= of the open")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the users' and ops' draw")
	fs.BoolVar(&c.NoOpen, "no-open", c.NoOpen, "use the activity as it is instead of opening it")
	fs.IntVar(&c.MaxRetries, "retries", c.MaxRetries, "429/503 retries per HTTP exchange")
	fs.DurationVar(&c.Hold, "hold", c.Hold, "open the activity with this hold (e.g. 2s): seats are HELD until confirmed or lapsed (0 = no holds)")
	fs.Float64Var(&c.NoShow, "no-show", c.NoShow, "fraction of users who never confirm a held seat; the others confirm as soon as they are seen HELD")
	fs.DurationVar(&c.SettleTimeout, "settle-timeout", c.SettleTimeout, "with a hold, how long to wait after the burst for every hold to be confirmed or lapse (default 30s + 20 holds)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object with every figure instead of text")
	fs.BoolVar(&o.progress, "progress", true, "show a progress bar on stderr when it is a terminal (never with -json)")
	fs.DurationVar(&o.timeout, "timeout", 0, "give up on the rehearsal after this long (0 = never)")
	fs.StringVar(&c.Token, "token", c.Token, "bearer token for an ingest that requires one, with allot:admin (default ALLOT_TOKEN); "+
		"with ALLOT_AUTH_HS256_KEY set instead, loadgen mints an admin token for the open and one token per simulated user")
	version := buildinfo.Flag(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, fmt.Errorf("%w: %w", errUsage, err)
	}
	if *version {
		buildinfo.Print(os.Stdout, binary)
		return o, flag.ErrHelp // exit 0, like -h
	}
	bad := func(msg string) (options, error) {
		fmt.Fprintf(stderr, "%s: %s\n", binary, msg)
		fs.Usage()
		return o, fmt.Errorf("%w: %s", errUsage, msg)
	}
	if fs.NArg() > 0 {
		return bad("unexpected arguments: " + strings.Join(fs.Args(), " "))
	}
	capacityGiven := false
	fs.Visit(func(f *flag.Flag) { capacityGiven = capacityGiven || f.Name == "capacity" })
	if !capacityGiven && !c.NoOpen && c.Activity != 0 {
		return bad("-capacity is required unless -no-open")
	}
	if o.timeout < 0 {
		return bad("-timeout must not be negative")
	}
	if c.Token == "" {
		c.Token = binaries.Getenv[binaries.Loadgen]().Token // not the flag's default: -h would print it
	}
	// Validated once, the flags and ALLOT_TOKEN applied.
	if err := c.Validate(); err != nil {
		return bad(strings.TrimPrefix(err.Error(), loadgen.ErrConfig.Error()+": "))
	}
	if key := binaries.Getenv[binaries.Loadgen]().AuthHS256Key; c.Token == "" && key != "" {
		if err := mintTokens(&o, key); err != nil {
			return bad(err.Error())
		}
	}
	return o, nil
}

// mintTokens gives o an admin token and a token per user, signed with the
// ingest's HS256 key: each simulated user then spends its own rate limit,
// as real users do. Tokens are minted once per user, on first use.
func mintTokens(o *options, key string) error {
	mint := func(sub string, scopes ...string) (string, error) {
		env := binaries.Getenv[binaries.Loadgen]()
		return auth.MintHS256([]byte(key), auth.Claims{Subject: sub, Scopes: scopes, TTL: 24 * time.Hour,
			Issuer: env.AuthIssuer, Audience: env.AuthAudience})
	}
	admin, err := mint("loadgen", auth.ScopeAdmin)
	if err != nil {
		return fmt.Errorf("ALLOT_AUTH_HS256_KEY: %w", err)
	}
	o.cfg.Token = admin
	var tokens sync.Map // user -> token
	o.userToken = func(user int64) string {
		if t, ok := tokens.Load(user); ok {
			return t.(string)
		}
		t, err := mint(strconv.FormatInt(user, 10))
		if err != nil {
			return admin // the key was good a moment ago; never happens
		}
		tokens.Store(user, t)
		return t
	}
	return nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, stderrIsTerminal bool) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2
	}
	c := o.cfg
	holds := ""
	if c.Hold != 0 || c.NoShow != 0 {
		holds = fmt.Sprintf(" hold=%s no-show=%g", c.Hold, c.NoShow)
	}
	// The tokens themselves are secrets: only how they were obtained.
	auth := "none"
	switch {
	case o.userToken != nil:
		auth = "tokens minted with ALLOT_AUTH_HS256_KEY (****)"
	case c.Token != "":
		auth = "bearer token (****)"
	}
	fmt.Fprintf(stderr, "%s: url=%s activity=%d capacity=%d n=%d users=%d c=%d mix=%s wait=%s seed=%d no-open=%t%s auth=%s\n",
		binary, c.BaseURL, c.Activity, c.Capacity, c.Requests, c.UserCount(), c.Concurrency, c.Mix, c.Wait, c.Seed, c.NoOpen, holds, auth)
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	deps := loadgen.Deps{UserToken: o.userToken}
	var bar *progressbar.ProgressBar
	if o.progress && !o.json && stderrIsTerminal {
		bar = progressbar.NewOptions(c.Requests,
			progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription("burst"),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("req"),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
		deps.Progress = func(done int) { bar.Set(done) } //nolint:errcheck // a progress bar that fails to draw is no error
	}
	rep, err := loadgen.Run(ctx, c, deps)
	if bar != nil {
		bar.Finish() //nolint:errcheck
	}
	if err != nil && rep.Results == 0 && rep.Errors == 0 {
		// Nothing was fired: the rehearsal could not run.
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	if o.json {
		out, jerr := json.Marshal(rep)
		if jerr != nil {
			fmt.Fprintf(stderr, "%s: encode the report: %v\n", binary, jerr)
			return 2
		}
		fmt.Fprintf(stdout, "%s\n", out)
	} else {
		rep.WriteText(stdout) //nolint:errcheck
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 1
	}
	if rep.Verdict() != nil {
		return 1
	}
	return 0
}
