package audit

import "github.com/allot-dev/allot/internal/allocation"

// SetDomainApply makes the audit replay through apply instead of
// allocation.Apply until restore is called. Only a test that does not call
// t.Parallel may use it: parallel tests start after it has restored.
func SetDomainApply(apply func(*allocation.Activity, allocation.Request, uint64) (*allocation.Activity, allocation.Decision, error)) (restore func()) {
	domainApply = apply
	return func() { domainApply = allocation.Apply }
}
