// Package store owns allot's MySQL side: connecting, the one transaction
// helper with retries, and the queries the allocator and ingest run. The
// migrations are applied by its subpackage schema, the allocator's
// checkpoints taken and read by its subpackage checkpoint. It speaks SQL
// that runs on MySQL 8 and MariaDB 10.11 alike.
package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-sql-driver/mysql"
)

// DBTX is what the queries need: a *sql.DB or a *sql.Tx.
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// ErrUnreachable is returned by Open and Check when MySQL does not answer.
var ErrUnreachable = errors.New("mysql is unreachable")

// Open connects to the database named in dsn with a pool of maxConns and
// checks that it answers. Placeholders are interpolated client side so that
// a statement costs one round trip instead of three.
func Open(ctx context.Context, dsn string, maxConns int) (*sql.DB, error) {
	db, addr, err := newPool(dsn, maxConns)
	if err != nil {
		return nil, err
	}
	if err := check(ctx, db, " at "+addr); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// OpenLater is a pool of dsn with Open's settings that connects when it is
// first used: the pool of a server that does not answer yet (a shard down
// while a process starts). Check it once the server answers, as Open does.
func OpenLater(dsn string, maxConns int) (*sql.DB, error) {
	db, _, err := newPool(dsn, maxConns)
	return db, err
}

// Check checks that db's server answers (within 10s) and notes its
// max_allowed_packet, which bounds the statements sent to every server:
// what Open does, for a pool of OpenLater. A server that does not answer
// is an ErrUnreachable.
func Check(ctx context.Context, db *sql.DB) error { return check(ctx, db, "") }

// check is Check; at (" at host:port", or "") follows ErrUnreachable in
// its error.
func check(ctx context.Context, db *sql.DB, at string) error {
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		return fmt.Errorf("%w%s: %w", ErrUnreachable, at, err)
	}
	var packet int64
	if err := db.QueryRowContext(pingCtx, "SELECT @@max_allowed_packet").Scan(&packet); err != nil {
		return fmt.Errorf("read max_allowed_packet: %w", err)
	}
	notePacket(packet)
	return nil
}

// newPool is a pool of dsn with allot's settings, not connected yet, and
// the server's address.
func newPool(dsn string, maxConns int) (*sql.DB, string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, "", fmt.Errorf("parse mysql dsn: %w", err)
	}
	cfg.InterpolateParams = true
	cfg.ParseTime = true
	// Strict mode on every connection, whatever the server's default: a
	// value that does not fit is an error, never a silent cut.
	// It overrides a sql_mode in the DSN on purpose.
	if cfg.Params == nil {
		cfg.Params = make(map[string]string, 1)
	}
	cfg.Params["sql_mode"] = StrictSQLMode
	// 0: the driver asks the server for its max_allowed_packet.
	cfg.MaxAllowedPacket = 0
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("mysql connector: %w", err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxLifetime(30 * time.Minute)
	return db, cfg.Addr, nil
}

// StrictSQLMode is the sql_mode of every connection Open makes. It holds on
// MySQL 8 and MariaDB 10.11 alike.
const StrictSQLMode = "'STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'"

// EnsureDatabase creates the database named in dsn if it does not exist.
func EnsureDatabase(ctx context.Context, dsn string) error {
	db, name, err := openServer(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+quoteIdent(name)+" CHARACTER SET utf8mb4"); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// DropDatabase drops the database named in dsn, if it exists, and returns
// its name.
func DropDatabase(ctx context.Context, dsn string) (string, error) {
	db, name, err := openServer(ctx, dsn)
	if err != nil {
		return name, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+quoteIdent(name)); err != nil {
		return name, fmt.Errorf("drop database %s: %w", name, err)
	}
	return name, nil
}

// openServer connects to the server of dsn without selecting its database,
// and returns the database's name.
func openServer(ctx context.Context, dsn string) (*sql.DB, string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, "", fmt.Errorf("parse mysql dsn: %w", err)
	}
	name := cfg.DBName
	if name == "" {
		return nil, "", errors.New("the mysql dsn names no database")
	}
	cfg.DBName = ""
	db, err := Open(ctx, cfg.FormatDSN(), 1)
	return db, name, err
}

func quoteIdent(s string) string {
	out := []byte{'`'}
	for i := 0; i < len(s); i++ {
		if s[i] == '`' {
			out = append(out, '`')
		}
		out = append(out, s[i])
	}
	return string(append(out, '`'))
}

// MySQL error numbers that mean "the transaction lost a race or its
// connection; run it again".
const (
	errLockWaitTimeout  = 1205
	errDeadlock         = 1213
	errSnapshotConflict = 1020 // MariaDB: record changed since last read
	errConnKilled       = 1927 // MariaDB: connection was killed
	errServerShutdown   = 1053
)

// Retryable reports whether err is worth running the transaction again for.
func Retryable(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case errLockWaitTimeout, errDeadlock, errSnapshotConflict, errConnKilled, errServerShutdown:
			return true
		}
		return false
	}
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, sql.ErrConnDone)
}

// MySQL error numbers that mean "this row's data is refused": the same
// statement fails the same way however often it runs.
var dataErrors = map[uint16]bool{
	1048: true, // column cannot be null
	1062: true, // duplicate entry
	1264: true, // out of range value
	1265: true, // data truncated
	1366: true, // incorrect value
	1406: true, // data too long
	1451: true, // foreign key (parent)
	1452: true, // foreign key (child)
	3819: true, // MySQL: check constraint violated
	4025: true, // MariaDB: CONSTRAINT failed
}

// Rejectable reports whether err is the database refusing the data itself,
// so that the request that carries it can be set aside. Everything else (a
// lost connection, an unreachable broker, a shutdown) is not the request's
// fault and must never cost it its application.
func Rejectable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && dataErrors[me.Number]
}

// TxOptions tunes WithTx.
type TxOptions struct {
	// Attempts bounds the runs of fn; 0 means retry until ctx ends.
	Attempts int
	// OnRetry, when set, is told of each error that is retried.
	OnRetry func(attempt int, err error)
	// Isolation overrides the server's default isolation level.
	Isolation sql.IsolationLevel
}

// WithTx runs fn in a transaction: begin, deferred rollback, commit. A
// deadlock, a lock-wait timeout, a snapshot conflict or a lost connection
// runs fn again (fn must therefore be safe to rerun) with jittered backoff.
func WithTx(ctx context.Context, db *sql.DB, opts TxOptions, fn func(tx *sql.Tx) error) error {
	backoff := 5 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := runTx(ctx, db, opts.Isolation, fn)
		if err == nil || !Retryable(err) || ctx.Err() != nil ||
			(opts.Attempts > 0 && attempt >= opts.Attempts) {
			return err
		}
		if opts.OnRetry != nil {
			opts.OnRetry(attempt, err)
		}
		sleep := backoff/2 + rand.N(backoff)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-time.After(sleep):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

func runTx(ctx context.Context, db *sql.DB, iso sql.IsolationLevel, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after commit
	if err := fn(tx); err != nil {
		return err
	}
	end := traceCommit(ctx)
	err = tx.Commit()
	end(err)
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
