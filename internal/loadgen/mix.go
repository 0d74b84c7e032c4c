package loadgen

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Mix weighs the operations of a burst; the weights need not sum to 1.
type Mix struct {
	Claim  float64 `json:"claim" default:"1"`
	Join   float64 `json:"join"`
	Cancel float64 `json:"cancel"`
	// Confirm weighs confirm taps (POST …/signups/{u}/confirm) drawn like
	// the other ops, whether or not the user holds a seat then. They are
	// apart from the confirms that follow a HELD seat (Config.NoShow).
	Confirm float64 `json:"confirm,omitempty"`
}

// DefaultMix is a pure claim burst, the flash sale: Config.Mix's default
// (its default tags).
var DefaultMix = Mix{Claim: 1}

// ErrBadMix is wrapped by ParseMix's errors.
var ErrBadMix = errors.New("bad -mix")

// ParseMix parses "claim=1,join=0,cancel=0,confirm=0": comma-separated op=weight
// pairs, each op at most once, weights finite and non-negative, not all
// zero. Ops left out weigh 0.
func ParseMix(s string) (Mix, error) {
	var m Mix
	if strings.TrimSpace(s) == "" {
		return m, fmt.Errorf("%w: empty; want e.g. claim=1,join=0,cancel=0", ErrBadMix)
	}
	seen := map[string]bool{}
	for part := range strings.SplitSeq(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return Mix{}, fmt.Errorf("%w: %q is not op=weight", ErrBadMix, part)
		}
		w, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || w < 0 || math.IsInf(w, 0) || math.IsNaN(w) {
			return Mix{}, fmt.Errorf("%w: the weight of %s must be a non-negative number, got %q", ErrBadMix, name, val)
		}
		if seen[name] {
			return Mix{}, fmt.Errorf("%w: %s is given twice", ErrBadMix, name)
		}
		seen[name] = true
		switch name {
		case "claim":
			m.Claim = w
		case "join":
			m.Join = w
		case "cancel":
			m.Cancel = w
		case "confirm":
			m.Confirm = w
		default:
			return Mix{}, fmt.Errorf("%w: unknown op %q (want claim, join, cancel or confirm)", ErrBadMix, name)
		}
	}
	if m.total() == 0 {
		return Mix{}, fmt.Errorf("%w: every weight is zero", ErrBadMix)
	}
	return m, nil
}

// String is the form ParseMix reads; confirm is left out when it weighs 0.
func (m Mix) String() string {
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	s := "claim=" + f(m.Claim) + ",join=" + f(m.Join) + ",cancel=" + f(m.Cancel)
	if m.Confirm != 0 {
		s += ",confirm=" + f(m.Confirm)
	}
	return s
}

// Set parses s into m, so that a *Mix is a flag.Value.
func (m *Mix) Set(s string) error {
	v, err := ParseMix(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// PureClaim reports whether the burst is claims only.
func (m Mix) PureClaim() bool { return m.Claim > 0 && m.Join == 0 && m.Cancel == 0 && m.Confirm == 0 }

func (m Mix) total() float64 { return m.Claim + m.Join + m.Cancel + m.Confirm }

func (m Mix) valid() bool {
	for _, w := range [...]float64{m.Claim, m.Join, m.Cancel, m.Confirm} {
		if w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			return false
		}
	}
	return m.total() > 0
}

// op codes of a planned request.
const (
	opClaim uint8 = iota
	opJoin
	opCancel
	opConfirm
)

// draw maps u in [0,1) to an op by the weights. Without confirm weight it
// draws exactly as before confirm existed, so old seeds replay.
func (m Mix) draw(u float64) uint8 {
	x := u * m.total()
	switch {
	case x < m.Claim:
		return opClaim
	case x < m.Claim+m.Join:
		return opJoin
	case m.Confirm > 0 && x >= m.Claim+m.Join+m.Cancel:
		return opConfirm
	case m.Cancel > 0:
		return opCancel
	case m.Join > 0:
		return opJoin // rounding at the top edge
	default:
		return opClaim
	}
}
