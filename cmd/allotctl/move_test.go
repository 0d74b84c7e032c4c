package main

import (
	"context"
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/shards"
)

// TestShardsMove: `allotctl shards move` refuses bad usage with exit 2 and
// one line (no flags, no -to, the shard the partition is on, an unknown
// shard, a partition the stream does not have); a move of a partition
// never applied prints its steps and how long it was frozen, exits 0 and
// leaves the map naming the new shard at the next epoch; an undo with
// nothing to undo says so and exits 0.
func TestShardsMove(t *testing.T) {
	ns := natstest.New(t)
	bases := dbtest.Servers(t, 2)
	db0, db1 := dbtest.NewOn(t, bases[0]), dbtest.NewOn(t, bases[1])
	t.Setenv("ALLOT_NATS_URL", ns.URL())
	t.Setenv("ALLOT_PARTITIONS", "2")
	t.Setenv("ALLOT_MYSQL_DSN", db0.DSN)
	t.Setenv("ALLOT_MYSQL_SHARDS", "s0="+db0.DSN+",s1="+db1.DSN)
	if code, _, stderr := allotctl(t, "setup"); code != 0 {
		t.Fatalf("setup: exit %d\n%s", code, stderr)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{}, "needs -partition"},
		{[]string{"-partition", "0"}, "needs -to"},
		{[]string{"-partition", "0", "-to", "s1", "-undo"}, "-undo takes no -to"},
		{[]string{"-partition", "0", "-to", "s0"}, "on shard s0 already"},
		{[]string{"-partition", "0", "-to", "s9"}, `shard "s9" is not one of ALLOT_MYSQL_SHARDS`},
		{[]string{"-partition", "2", "-to", "s1"}, "partition 2 is not one of the request stream's 2"},
	} {
		code, _, stderr := allotctl(t, append([]string{"shards", "move"}, c.args...)...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("shards move %v: exit %d, stderr %q; want 2 and %q", c.args, code, stderr, c.want)
		}
	}
	code, stdout, stderr := allotctl(t, "shards", "move", "-partition", "0", "-to", "s1", "-settle", "100ms")
	if code != 0 {
		t.Fatalf("shards move: exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, step := range []string{"freeze ", "copy ", "verify ", "fence ", "flip ", "resume ", "clean ", "frozen for", "took "} {
		if !strings.Contains(stdout, step) {
			t.Errorf("shards move: no %q in\n%s", step, stdout)
		}
	}
	_, js := ns.Connect(t)
	b, err := js.KeyValue(context.Background(), shards.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := shards.Get(context.Background(), b, 0)
	if err != nil || pl.Shard != "s1" || pl.Epoch != 2 {
		t.Errorf("the map after the move: %+v, %v; want s1 at epoch 2", pl, err)
	}
	if code, stdout, stderr := allotctl(t, "shards", "move", "-partition", "0", "-undo"); code != 0 || !strings.Contains(stdout, "no move of partition 0 to undo") {
		t.Errorf("undo with nothing to undo: exit %d\n%s\n%s", code, stdout, stderr)
	}
}
