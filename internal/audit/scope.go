package audit

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/allot-dev/allot/internal/audit/snapshot"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// KindMisplaced: rows of an activity (its activity, activity_signup and
// waitlist_bucket rows, its results, its refused messages) on a shard that
// does not own the activity's partition. One divergence per activity and
// shard, counting the rows of each table.
const KindMisplaced Kind = "misplaced"

// scope is the part of the stream and of the database one audit covers:
// every partition (parts nil) or some, and, when one shard of several is
// audited, that shard and where the map puts every partition.
type scope struct {
	parts map[int]bool
	shard *shardScope
}

// shardScope is the shard an audit reads, among several.
type shardScope struct {
	name string
	// owner is the shard the map puts each partition on, epoch its epoch.
	owner map[int]string
	epoch map[int]uint64
	// filter is Config.Partitions as a set (nil: every partition): rows
	// of a partition outside it are neither audited nor misplaced.
	filter map[int]bool
}

// owned are the partitions the map puts on the shard.
func (sh *shardScope) owned() []int64 {
	var out []int64
	for p, name := range sh.owner {
		if name == sh.name {
			out = append(out, int64(p))
		}
	}
	slices.Sort(out)
	return out
}

// partSet is ps as a set; nil when ps is empty (every partition).
func partSet(ps []int) map[int]bool {
	if len(ps) == 0 {
		return nil
	}
	out := make(map[int]bool, len(ps))
	for _, p := range ps {
		out[p] = true
	}
	return out
}

// list is the audited partitions in order; nil for every partition,
// empty (not nil) for none.
func (sc scope) list() []int {
	if sc.parts == nil {
		return nil
	}
	return append([]int{}, slices.Sorted(maps.Keys(sc.parts))...)
}

// partAudited says whether partition p is audited.
func (a *auditor) partAudited(p int) bool { return a.run.parts == nil || a.run.parts[p] }

// activityPartition is the partition activity's requests are stored in.
func (a *auditor) activityPartition(activity int64) int {
	return bus.PartitionOf(activity, a.run.partitions)
}

// activityInScope says whether activity's rows are compared: it is among
// the audited activities and its partition among the audited partitions.
func (a *auditor) activityInScope(activity int64) bool {
	return a.audited(activity) && a.partAudited(a.activityPartition(activity))
}

// partitionOfSubject is the partition a stored request subject belongs to
// (always 0 with one partition); false for a subject of no partition.
func partitionOfSubject(subject string, partitions int) (int, bool) {
	if partitions <= 1 {
		return 0, true
	}
	rest, _ := strings.CutPrefix(subject, wire.RequestSubjectPrefix)
	tok, _, _ := strings.Cut(rest, ".")
	n, err := strconv.Atoi(tok)
	if err != nil || n < 0 || n >= partitions || strconv.Itoa(n) != tok {
		return 0, false
	}
	return n, true
}

// setFences keeps the fence rows of the audited partitions: a message
// is pending past its own partition's fence, and a.fence is the highest.
// Auditing a shard, each of its partitions' rows must be at the map's
// epoch: a frozen row (or one past the map) is a move under way.
func (a *auditor) setFences(fences map[int]snapshot.Fence) error {
	a.fences = make(map[int]uint64, len(fences))
	for p, f := range fences {
		if sh := a.run.shard; sh != nil {
			if err := sh.checkEpoch(p, f); err != nil {
				return err
			}
		}
		if !a.partAudited(p) {
			continue
		}
		a.fences[p] = f.LastSeq
		a.fence = max(a.fence, f.LastSeq)
	}
	return nil
}

// checkEpoch refuses to audit a partition caught in a move: its row on
// its shard frozen or at another epoch than the map's, or a row on
// another shard past the map's epoch (the move's copy, before the map
// names it).
func (sh *shardScope) checkEpoch(p int, f snapshot.Fence) error {
	if sh.filter != nil && !sh.filter[p] {
		return nil
	}
	want, owned := sh.epoch[p], sh.owner[p] == sh.name
	epoch := "NULL (frozen)"
	if f.Epoch.Valid {
		epoch = strconv.FormatInt(f.Epoch.Int64, 10)
	}
	if owned && (!f.Epoch.Valid || uint64(f.Epoch.Int64) != want) ||
		!owned && f.Epoch.Valid && uint64(f.Epoch.Int64) > want {
		return fmt.Errorf("audit: partition %d's fence row on shard %s is at epoch %s, the shard map puts it on %s at epoch %d: "+
			"the partition is being moved (or a move stopped half way); audit again once `allotctl shards move` is done",
			p, sh.name, epoch, sh.owner[p], want)
	}
	return nil
}

// fenceOf is the fence of the partition of a message on subject: the
// highest fence for a subject of no partition.
func (a *auditor) fenceOf(subject string) uint64 {
	if p, ok := partitionOfSubject(subject, a.run.partitions); ok && a.run.partitions > 1 {
		return a.fences[p]
	}
	return a.fence
}

// checkPartitions refuses partitions the stream does not have.
func (a *auditor) checkPartitions() error {
	for _, p := range a.run.cfg.Partitions {
		if p >= a.run.partitions {
			return configError(fmt.Sprintf("partition %d: %s has %d partitions (0..%d)", p, wire.RequestStream, a.run.partitions, a.run.partitions-1))
		}
	}
	return nil
}

// narrowRejected keeps the rejected_message rows of the audited
// partitions; auditing a shard, those of a partition it does not own are
// misplaced.
func (a *auditor) narrowRejected() {
	if a.run.parts == nil {
		return
	}
	for place, r := range a.rejected {
		p, ok := partitionOfSubject(r.Subject, a.run.partitions)
		if ok && a.partAudited(p) {
			continue
		}
		delete(a.rejected, place)
		if ok && a.stray(p, rejectedActivity(r)) {
			a.strayRow(p, rejectedActivity(r), "rejected_message", place, r.RequestID)
		}
	}
}

// strayKey names the misplaced rows of one activity (0: a partition's
// voids) of one partition.
type strayKey struct {
	partition int
	activity  int64
}

// strays are the misplaced rows found on an audited shard.
type strays struct {
	rows map[strayKey]map[string]int // by table
	// first is the earliest place of a misplaced result or refusal, and
	// its request id.
	first map[strayKey]change
}

// stray says whether a row of partition p (of activity, 0 for none)
// found on the audited shard is misplaced: the shard does not own p, and
// the row is among those the audit was asked about.
func (a *auditor) stray(p int, activity int64) bool {
	sh := a.run.shard
	if sh == nil || sh.owner[p] == sh.name || sh.filter != nil && !sh.filter[p] {
		return false
	}
	return a.subjects == nil || activity != 0 && a.subjects[activityKey(activity)]
}

func (a *auditor) strayRow(p int, activity int64, table string, place uint64, requestID string) {
	a.strayRows(p, activity, table, 1, place, requestID)
}

// strayRows counts n misplaced rows of table; place (0: none) is the
// earliest place among them.
func (a *auditor) strayRows(p int, activity int64, table string, n int, place uint64, requestID string) {
	s := &a.strays
	if s.rows == nil {
		s.rows, s.first = make(map[strayKey]map[string]int), make(map[strayKey]change)
	}
	k := strayKey{p, activity}
	if s.rows[k] == nil {
		s.rows[k] = make(map[string]int)
	}
	s.rows[k][table] += n
	if place != 0 {
		if f, ok := s.first[k]; !ok || place < f.place {
			s.first[k] = change{place: place, requestID: requestID}
		}
	}
}

// strayTables is the order misplaced rows are counted in.
var strayTables = []string{"activity", "activity_signup", "waitlist_bucket", "processed_request", "rejected_message"}

// misplaced looks, on an audited shard, for rows of partitions it does
// not own and reports one divergence per activity (and partition) that
// has any, at the earliest result or refusal among them.
func (a *auditor) misplaced(ctx context.Context, tx *sql.Tx) error {
	if a.run.shard == nil {
		return nil
	}
	byActivity := func(table, query string) error {
		rows, err := tx.QueryContext(ctx, query)
		if err != nil {
			return fmt.Errorf("audit: look for misplaced %s rows: %w", table, err)
		}
		defer rows.Close()
		for rows.Next() {
			var (
				id int64
				n  int
			)
			if err := rows.Scan(&id, &n); err != nil {
				return fmt.Errorf("audit: look for misplaced %s rows: %w", table, err)
			}
			if p := a.activityPartition(id); a.stray(p, id) {
				a.strayRows(p, id, table, n, 0, "")
			}
		}
		return rows.Err()
	}
	for _, q := range [][2]string{
		{"activity", "SELECT id, 1 FROM activity"},
		{"activity_signup", "SELECT activity_id, COUNT(*) FROM activity_signup GROUP BY activity_id"},
		{"waitlist_bucket", "SELECT activity_id, COUNT(*) FROM waitlist_bucket GROUP BY activity_id"},
	} {
		if err := byActivity(q[0], q[1]); err != nil {
			return err
		}
	}
	// Results: by the partition they were applied in; the shard's own
	// partitions are skipped by the primary key's prefix.
	query := "SELECT partition_id, activity_id, COUNT(*), MIN(seq) FROM processed_request"
	if own := a.run.shard.owned(); len(own) > 0 {
		query += " WHERE partition_id NOT IN (" + store.IntList(own) + ")"
	}
	rows, err := tx.QueryContext(ctx, query+" GROUP BY partition_id, activity_id")
	if err != nil {
		return fmt.Errorf("audit: look for misplaced processed_request rows: %w", err)
	}
	type group struct {
		k     strayKey
		n     int
		first uint64
	}
	var groups []group
	for rows.Next() {
		var g group
		if err := rows.Scan(&g.k.partition, &g.k.activity, &g.n, &g.first); err != nil {
			rows.Close()
			return fmt.Errorf("audit: look for misplaced processed_request rows: %w", err)
		}
		if a.stray(g.k.partition, g.k.activity) {
			groups = append(groups, g)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("audit: look for misplaced processed_request rows: %w", err)
	}
	for _, g := range groups {
		var (
			index int
			id    string
		)
		if err := tx.QueryRowContext(ctx, "SELECT batch_index, request_id FROM processed_request WHERE partition_id = ? AND seq = ? ORDER BY batch_index LIMIT 1",
			g.k.partition, g.first).Scan(&index, &id); err != nil {
			return fmt.Errorf("audit: read a misplaced processed_request row: %w", err)
		}
		a.strayRows(g.k.partition, g.k.activity, "processed_request", g.n, wire.Place(g.first, index), id)
	}

	keys := slices.SortedFunc(maps.Keys(a.strays.rows), func(x, y strayKey) int {
		if c := cmp.Compare(x.activity, y.activity); c != 0 {
			return c
		}
		return cmp.Compare(x.partition, y.partition)
	})
	for _, k := range keys {
		var parts []string
		for _, table := range strayTables {
			if n := a.strays.rows[k][table]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s row(s)", n, table))
			}
		}
		what := "activity " + itoa(k.activity)
		if k.activity == 0 {
			what = "the voids of partition " + strconv.Itoa(k.partition)
		}
		first := a.strays.first[k]
		a.diverge(at(first.place, Divergence{
			RequestID: first.requestID, Kind: KindMisplaced, ActivityID: k.activity,
			Expected: fmt.Sprintf("no rows on shard %s: partition %d is on shard %s", a.run.shard.name, k.partition, a.run.shard.owner[k.partition]),
			Actual:   strings.Join(parts, ", "),
			Detail:   "rows of " + what + " on a shard that does not own its partition",
		}))
	}
	return nil
}

// rejectedActivity is the activity of a refused message's subject (0 for
// none).
func rejectedActivity(r snapshot.Rejected) int64 {
	id, _ := strconv.ParseInt(wire.ActivityOfSubject(r.Subject), 10, 64)
	return id
}
