package loadgen

import "math/rand/v2"

// plan is who does what in each request of a burst, fixed before firing so
// that a seed replays the same burst.
type plan struct {
	users []int64
	ops   []uint8
}

// makePlan draws n requests: request i goes to user (i mod users)+1 before
// a seeded shuffle, so fewer users than requests means repeat taps and each
// user taps ⌈n/users⌉ or ⌊n/users⌋ times; each op is drawn by the mix.
func makePlan(n, users int, mix Mix, seed uint64) plan {
	p := plan{users: make([]int64, n), ops: make([]uint8, n)}
	for i := range p.users {
		p.users[i] = int64(i%users) + 1
	}
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	r.Shuffle(n, func(i, j int) { p.users[i], p.users[j] = p.users[j], p.users[i] })
	for i := range p.ops {
		p.ops[i] = mix.draw(r.Float64())
	}
	return p
}
