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

// noShow reports whether user is a no-show of the burst drawn with seed:
// a user who never confirms a seat held for them. Each user is drawn once,
// by a hash of the seed and the user, so the fraction is p over many users
// and a seed replays the same no-shows.
func noShow(user int64, seed uint64, p float64) bool {
	switch {
	case p <= 0:
		return false
	case p >= 1:
		return true
	}
	return unit(uint64(user), seed^0x6a09e667f3bcc909) < p
}

// unit hashes (x, seed) to [0,1) with splitmix64's finalizer.
func unit(x, seed uint64) float64 {
	z := x*0x9e3779b97f4a7c15 + seed
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}

// dropNoShowConfirms redraws the confirm taps of no-shows from the mix's
// other ops, so that a no-show never confirms. The redraw hashes the
// request's index: the plan's random stream, and so every other request,
// is unchanged.
func (p plan) dropNoShowConfirms(mix Mix, seed uint64, fraction float64) {
	if mix.Confirm == 0 || fraction <= 0 {
		return
	}
	rest := mix
	rest.Confirm = 0
	for i, op := range p.ops {
		if op == opConfirm && noShow(p.users[i], seed, fraction) {
			p.ops[i] = rest.draw(unit(uint64(i), seed^0xbb67ae8584caa73b))
		}
	}
}
