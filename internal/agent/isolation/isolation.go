// Package isolation holds a sandbox back from ready until its pool's
// NetworkPolicy is enforced. A NetworkPolicy is programmed by the cluster's
// network plugin some time after the pod starts (kube-router here took long
// enough that a new pod's first code reached the API server, cluster DNS and
// the metadata address in an e2e run), so the agent checks for itself: it
// dials an address the policy must block (the API server's Service, which
// the manager names unless the pool's egress allows it) and reports ready
// only once that fails.
package isolation

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// Canary watches one address the sandbox must not reach.
type Canary struct {
	addr     string
	enforced atomic.Bool
}

const (
	dialTimeout = 500 * time.Millisecond
	retry       = 250 * time.Millisecond
)

// Start dials addr until the dial fails; "" means there is nothing to wait
// for. onGiveUp is called if the policy is still not enforced after giveUp.
func Start(ctx context.Context, addr string, giveUp time.Duration, log logr.Logger, onGiveUp func(msg string)) *Canary {
	c := &Canary{addr: addr}
	if addr == "" {
		c.enforced.Store(true)
		return c
	}
	go c.run(ctx, giveUp, log, onGiveUp)
	return c
}

func (c *Canary) run(ctx context.Context, giveUp time.Duration, log logr.Logger, onGiveUp func(string)) {
	start := time.Now()
	d := net.Dialer{Timeout: dialTimeout}
	for i := 0; ; i++ {
		conn, err := d.DialContext(ctx, "tcp", c.addr)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.enforced.Store(true)
			log.Info("the pool's NetworkPolicy holds", "blocked", c.addr, "after", time.Since(start).Round(time.Millisecond).String())
			return
		}
		_ = conn.Close()
		if i == 0 {
			log.Info("not ready until the pool's NetworkPolicy is enforced", "reachable", c.addr)
		}
		if time.Since(start) > giveUp {
			onGiveUp("the pool's NetworkPolicy is not enforced: after " + giveUp.String() + " the sandbox still reaches " +
				c.addr + "; does the cluster's network plugin enforce NetworkPolicy?")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// Enforced reports whether the canary address was found blocked.
func (c *Canary) Enforced() bool { return c.enforced.Load() }

// Addr is the address the canary dials.
func (c *Canary) Addr() string { return c.addr }
