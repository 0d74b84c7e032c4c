package move

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"golang.org/x/sync/errgroup"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// by says how a table's rows of a partition are told apart.
type by int

const (
	byPartition by = iota // a partition_id column
	byActivity            // an activity id column: bus.PartitionOf(id)
	bySubject             // the stored subject alloc.req.<partition>.<activity>
)

// table is one table holding per-partition or per-activity state.
type table struct {
	name string
	key  []string // the primary key, in order: the copy's page order
	by   by
	col  string // the column by reads
	page int    // rows a page reads (long values: fewer)
}

// tables are every table holding a partition's state (migrations/), in
// the order the copy writes them. clear deletes them in reverse, the
// activity rows (which name the partition's activities) last.
var tables = []table{
	{"allocator_partition", []string{"partition_id"}, byPartition, "partition_id", 1},
	{"event_relay", []string{"partition_id"}, byPartition, "partition_id", 1},
	{"activity", []string{"id"}, byActivity, "id", 1000},
	{"waitlist_bucket", []string{"activity_id", "first_seq"}, byActivity, "activity_id", 1000},
	{"activity_signup", []string{"activity_id", "user_id"}, byActivity, "activity_id", 1000},
	{"processed_request", []string{"partition_id", "seq", "batch_index"}, byPartition, "partition_id", 1000},
	{"processed_request_part", []string{"partition_id", "seq", "batch_index", "col", "piece"}, byPartition, "partition_id", 8},
	{"outbox_skipped", []string{"partition_id", "seq", "batch_index"}, byPartition, "partition_id", 500},
	{"rejected_message", []string{"seq", "batch_index"}, bySubject, "subject", 500},
	{"allocator_checkpoint", []string{"partition_id", "seq"}, byPartition, "partition_id", 500},
	{"allocator_checkpoint_activity", []string{"partition_id", "seq", "activity_id"}, byPartition, "partition_id", 1000},
	{"allocator_checkpoint_signup", []string{"partition_id", "seq", "activity_id", "user_id"}, byPartition, "partition_id", 1000},
}

// shared are the tables that hold no partition's state: they stay.
var shared = []string{"schema_migration", "place_migration"}

// idGroup bounds the activity ids of one IN list.
const idGroup = 500

// scope is one partition's rows on one shard: the partition, the number
// of partitions, and its activities there.
type scope struct {
	p, partitions int
	ids           []int64 // ascending
}

// activityIDs reads the ids of q's activities that belong to partition p.
func activityIDs(ctx context.Context, q store.DBTX, p, partitions int) ([]int64, error) {
	var out []int64
	after := int64(-1 << 63)
	for {
		rows, err := q.QueryContext(ctx, "SELECT id FROM activity WHERE id > ? ORDER BY id LIMIT 10000", after)
		if err != nil {
			return nil, fmt.Errorf("read activity ids: %w", err)
		}
		n := 0
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, fmt.Errorf("read activity ids: %w", err)
			}
			n++
			after = id
			if bus.PartitionOf(id, partitions) == p {
				out = append(out, id)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("read activity ids: %w", err)
		}
		if n < 10000 {
			return out, nil
		}
	}
}

// filters are the WHERE conditions, with their arguments, that pick the
// scope's rows of t: one, or one per group of activity ids.
func (s scope) filters(t table) []filter {
	switch t.by {
	case byActivity:
		var out []filter
		for ids := s.ids; len(ids) > 0; {
			n := min(len(ids), idGroup)
			out = append(out, filter{t.col + " IN (" + store.IntList(ids[:n]) + ")", nil})
			ids = ids[n:]
		}
		return out
	case bySubject:
		if s.partitions <= 1 {
			return []filter{{"1 = 1", nil}}
		}
		return []filter{{t.col + " LIKE ?", []any{wire.RequestSubjectPrefix + strconv.Itoa(s.p) + ".%"}}}
	}
	return []filter{{t.col + " = ?", []any{s.p}}}
}

type filter struct {
	where string
	args  []any
}

// columns reads t's columns on q that a copy writes: every one but a
// generated column and an auto-increment id (activity_signup.id, which
// nothing reads; the new shard numbers its own rows). It reads them from
// SHOW CREATE TABLE, not information_schema: MariaDB 10.11 materialises
// an information_schema query in an internal Aria table, and a private
// server was seen to crash dropping one (ha_maria::drop_table) under a
// move's load.
func columns(ctx context.Context, q store.DBTX, t string) ([]string, error) {
	var name, create string
	err := q.QueryRowContext(ctx, "SHOW CREATE TABLE `"+t+"`").Scan(&name, &create)
	if err != nil {
		if mysqlErr := (*mysql.MySQLError)(nil); errors.As(err, &mysqlErr) && mysqlErr.Number == 1146 { // ER_NO_SUCH_TABLE
			return nil, fmt.Errorf("table %s is missing: run the allocator's migrations on every shard (allocator -migrate-only)", t)
		}
		return nil, fmt.Errorf("read the columns of %s: %w", t, err)
	}
	out := copiedColumns(create)
	if len(out) == 0 {
		return nil, fmt.Errorf("table %s has no column to copy in its definition: run the allocator's migrations on every shard (allocator -migrate-only)", t)
	}
	return out, nil
}

// copiedColumns are the columns of a CREATE TABLE statement as MySQL and
// MariaDB print it (one definition a line, "  `name` type ..."), in order,
// but those generated (GENERATED ALWAYS AS, or MariaDB's bare AS (...))
// and the auto-increment one.
func copiedColumns(create string) []string {
	var out []string
	for _, line := range strings.Split(create, "\n") {
		rest, ok := strings.CutPrefix(line, "  `")
		if !ok {
			continue // the CREATE line, a key, a constraint, the options
		}
		col, def, ok := strings.Cut(rest, "`")
		if !ok {
			continue
		}
		up := strings.ToUpper(def)
		if strings.Contains(up, " AUTO_INCREMENT") || strings.Contains(up, " GENERATED ALWAYS AS ") || strings.Contains(up, " AS (") {
			continue
		}
		out = append(out, col)
	}
	return out
}

// sums are a table's rows of the scope counted and checksummed.
type sums struct {
	Rows int64  `json:"rows"`
	Sum  string `json:"sum"` // the sum of every row's 60-bit hash, in decimal
}

// checksum counts and checksums the scope's rows of t on q, over cols:
// the sum of a hash of each row's values (order does not matter, so
// either shard may read in any order).
func (s scope) checksum(ctx context.Context, q store.DBTX, t table, cols []string) (sums, error) {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = "IFNULL(CAST(`" + c + "` AS CHAR), '\\N')"
	}
	expr := "CAST(CONV(SUBSTRING(MD5(CONCAT_WS('|', " + strings.Join(parts, ", ") + ")), 1, 15), 16, 10) AS UNSIGNED)"
	total := new(big.Int)
	var out sums
	for _, f := range s.filters(t) {
		var n int64
		var sum string
		if err := q.QueryRowContext(ctx, "SELECT COUNT(*), CAST(COALESCE(SUM("+expr+"), 0) AS CHAR) FROM "+t.name+" WHERE "+f.where, f.args...).Scan(&n, &sum); err != nil {
			return sums{}, fmt.Errorf("checksum %s: %w", t.name, err)
		}
		v, ok := new(big.Int).SetString(sum, 10)
		if !ok {
			return sums{}, fmt.Errorf("checksum %s: %q is not a number", t.name, sum)
		}
		total.Add(total, v)
		out.Rows += n
	}
	out.Sum = total.String()
	return out, nil
}

// keyAfter is the keyset condition "key > vals" over key's columns.
func keyAfter(key []string, vals []any) (string, []any) {
	if len(key) == 1 {
		return "`" + key[0] + "` > ?", []any{vals[0]}
	}
	rest, args := keyAfter(key[1:], vals[1:])
	return "(`" + key[0] + "` > ? OR (`" + key[0] + "` = ? AND " + rest + "))", append([]any{vals[0], vals[0]}, args...)
}

// copyTable copies the scope's rows of t from src (the snapshot) to dst in
// pages of t.page rows, each page one multi-row INSERT (or more, bounded
// in bytes) committed on its own. The next page is read from the snapshot
// while the last one is written, so the copy waits for the two servers
// side by side rather than one after the other. It returns the rows
// copied.
func (s scope) copyTable(ctx context.Context, src *sql.Tx, dst *sql.DB, t table, cols []string) (int64, error) {
	keyAt := make([]int, len(t.key))
	for i, k := range t.key {
		keyAt[i] = slices.Index(cols, k)
		if keyAt[i] < 0 {
			return 0, fmt.Errorf("table %s has no key column %s", t.name, k)
		}
	}
	list := "`" + strings.Join(cols, "`, `") + "`"
	order := "`" + strings.Join(t.key, "`, `") + "`"
	var copied int64
	pages := make(chan [][]any, 1)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(pages)
		for _, f := range s.filters(t) {
			var last []any
			for {
				where, args := f.where, slices.Clone(f.args)
				if last != nil {
					cond, kargs := keyAfter(t.key, last)
					where += " AND " + cond
					args = append(args, kargs...)
				}
				page, err := readPage(gctx, src, "SELECT "+list+" FROM "+t.name+" WHERE "+where+" ORDER BY "+order+" LIMIT "+strconv.Itoa(t.page), args, len(cols))
				if err != nil {
					return fmt.Errorf("copy %s: read: %w", t.name, err)
				}
				if len(page) > 0 {
					select {
					case pages <- page:
					case <-gctx.Done():
						return gctx.Err()
					}
				}
				if len(page) < t.page {
					break
				}
				last = make([]any, len(t.key))
				for i, at := range keyAt {
					last[i] = page[len(page)-1][at]
				}
			}
		}
		return nil
	})
	g.Go(func() error {
		for page := range pages {
			if err := insertRows(gctx, dst, t.name, list, page); err != nil {
				return fmt.Errorf("copy %s: write: %w", t.name, err)
			}
			copied += int64(len(page))
		}
		return nil
	})
	err := g.Wait()
	return copied, err
}

func readPage(ctx context.Context, q store.DBTX, query string, args []any, n int) ([][]any, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][]any
	for rows.Next() {
		vals := make([]any, n)
		ptrs := make([]any, n)
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		out = append(out, vals)
	}
	return out, rows.Err()
}

// statementBytes bounds one multi-row INSERT of the copy.
const statementBytes = 1 << 20

func insertRows(ctx context.Context, db *sql.DB, name, list string, page [][]any) error {
	one := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(strings.Split(list, ","))), ", ") + ")"
	for len(page) > 0 {
		n, size := 0, 0
		for n < len(page) && (n == 0 || size < statementBytes) {
			for _, v := range page[n] {
				switch v := v.(type) {
				case []byte:
					size += len(v)
				case string:
					size += len(v)
				default:
					size += 8
				}
			}
			n++
		}
		var args []any
		for _, r := range page[:n] {
			args = append(args, r...)
		}
		q := "INSERT INTO " + name + " (" + list + ") VALUES " + strings.TrimSuffix(strings.Repeat(one+", ", n), ", ")
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			return err
		}
		page = page[n:]
	}
	return nil
}

// clearTable deletes the scope's rows of t on db, a bounded number a
// statement, and returns how many.
func (s scope) clearTable(ctx context.Context, db *sql.DB, t table) (int64, error) {
	const limit = 1000
	var n int64
	for _, f := range s.filters(t) {
		for {
			res, err := db.ExecContext(ctx, "DELETE FROM "+t.name+" WHERE "+f.where+" LIMIT "+strconv.Itoa(limit), f.args...)
			if err != nil {
				return n, fmt.Errorf("delete from %s: %w", t.name, err)
			}
			k, err := res.RowsAffected()
			if err != nil {
				return n, fmt.Errorf("delete from %s: %w", t.name, err)
			}
			n += k
			if k < limit {
				break
			}
		}
	}
	return n, nil
}
