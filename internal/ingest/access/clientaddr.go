package access

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// clientAddr is the address of the client that sent r: the peer, or, when
// the peer is a trusted proxy, the rightmost address in X-Forwarded-For
// that is not itself a trusted proxy (each proxy appends the address it
// got the request from, so everything left of the first untrusted hop may
// be forged by the client). With no trusted proxy the header is ignored.
func clientAddr(r *http.Request, trusted []netip.Prefix) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if len(trusted) == 0 {
		return host
	}
	peer, err := netip.ParseAddr(host)
	if err != nil || !isTrusted(peer, trusted) {
		return host
	}
	hops := forwardedHops(r.Header.Values("X-Forwarded-For"))
	client := host
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(hops[i])
		if err != nil {
			// Not an address: the client wrote it, or a proxy we do not
			// know. The last good hop is as far as the chain can be trusted.
			return client
		}
		client = a.Unmap().String()
		if !isTrusted(a, trusted) {
			return client
		}
	}
	return client
}

// forwardedHops splits X-Forwarded-For values (several headers count as
// one list, in order) into trimmed hops, dropping a port or IPv6 brackets.
func forwardedHops(values []string) []string {
	var hops []string
	for _, v := range values {
		for h := range strings.SplitSeq(v, ",") {
			h = strings.TrimSpace(h)
			if host, _, err := net.SplitHostPort(h); err == nil {
				h = host
			}
			hops = append(hops, strings.Trim(h, "[]"))
		}
	}
	return hops
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	a = a.Unmap()
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ParseTrustedProxies parses ALLOT_TRUSTED_PROXIES: a comma-separated list
// of CIDR prefixes or single addresses.
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("ALLOT_TRUSTED_PROXIES must be a comma-separated list of CIDR prefixes or addresses, got %q", f)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}
