package broker

import (
	"fmt"

	"thermite/internal/rpc"
)

func (b *Broker) startupSelftest() error { return nil }

// Selftest runs the isolation self-test.
func (b *Broker) Selftest(force, startup bool) (*rpc.SelftestResult, error) {
	return nil, fmt.Errorf("selftest: not available")
}
