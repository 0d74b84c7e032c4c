package waitlist

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestWaitlistBucketsFollowTheLine: random joins, head promotions and
// leaves from anywhere keep the buckets exact (every waiter in the bucket
// its queue_seq falls in, every count right), each bucket within its size,
// any two neighbours more than one bucket's worth (so the number of buckets
// stays below 2n/size+1), and a rank computed from the buckets equal to the
// waiter's place in the line.
func TestWaitlistBucketsFollowTheLine(t *testing.T) {
	for _, size := range []int64{1, 2, 4, 7} {
		r := rand.New(rand.NewPCG(uint64(size), 9))
		w := &Waitlist{max: size}
		var line []uint64 // queue_seqs in order
		seq := uint64(0)
		for step := range 5000 {
			switch op := r.IntN(10); {
			case op < 5 || len(line) == 0:
				seq += 1 + uint64(r.IntN(3))
				if err := w.Join(seq); err != nil {
					t.Fatal(err)
				}
				line = append(line, seq)
			case op < 7:
				if err := w.Leave(line[0]); err != nil {
					t.Fatal(err)
				}
				line = line[1:]
			default:
				i := r.IntN(len(line))
				if err := w.Leave(line[i]); err != nil {
					t.Fatal(err)
				}
				line = slices.Delete(line, i, i+1)
			}
			if !w.Fits(line) {
				t.Fatalf("size %d step %d: buckets %v do not fit the line %v", size, step, w.b, line)
			}
			for i := 1; i < len(w.b); i++ {
				if w.b[i-1].Waiting+w.b[i].Waiting <= size {
					t.Fatalf("size %d step %d: neighbours %v and %v fit in one bucket", size, step, w.b[i-1], w.b[i])
				}
			}
			if n := int64(len(line)); int64(len(w.b)) > 2*n/size+1 {
				t.Fatalf("size %d step %d: %d buckets for %d waiters", size, step, len(w.b), n)
			}
			if len(line) > 0 {
				k := r.IntN(len(line))
				if got := w.rank(line[k], line); got != int64(k+1) {
					t.Fatalf("size %d step %d: rank of %d from the buckets %d, want %d", size, step, line[k], got, k+1)
				}
			}
		}
	}
}

// rank is what GetSignup computes: the buckets before seq's own plus the
// waiters of its own bucket up to seq.
func (w *Waitlist) rank(seq uint64, line []uint64) int64 {
	var n int64
	first := uint64(0)
	for _, b := range w.b {
		if b.FirstSeq > seq {
			break
		}
		n += b.Waiting
		first = b.FirstSeq
	}
	own := w.b[0].Waiting
	for _, b := range w.b {
		if b.FirstSeq == first {
			own = b.Waiting
		}
	}
	n -= own
	for _, s := range line {
		if s >= first && s <= seq {
			n++
		}
	}
	return n
}

// TestWaitlistRefusesWhatDoesNotFit: a join below the last bucket and a
// leave before the first are refused (the allocator then rebuilds).
func TestWaitlistRefusesWhatDoesNotFit(t *testing.T) {
	w := Build([]uint64{10, 20, 30}, 0)
	if err := w.Join(5); err == nil {
		t.Fatal("a join below the last bucket was taken")
	}
	if err := w.Leave(3); err == nil {
		t.Fatal("a leave before the first bucket was taken")
	}
	if !w.Fits([]uint64{30, 10, 20}) || w.Fits([]uint64{10, 20}) || w.Fits([]uint64{5, 10, 20, 30}) {
		t.Fatal("Fits does not tell the line it was built from from others")
	}
}
