package isolation

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
)

// reachable listens on loopback and accepts every connection, as an address
// the policy does not block yet; closing it makes dials fail, as the policy does.
func reachable(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return l
}

func TestCanaryWaitsUntilTheAddressIsBlocked(t *testing.T) {
	l := reachable(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gaveUp := make(chan string, 1)
	c := Start(ctx, l.Addr().String(), time.Minute, testr.New(t), func(m string) { gaveUp <- m })
	time.Sleep(600 * time.Millisecond)
	if c.Enforced() {
		t.Fatal("ready while the canary address is reachable")
	}
	_ = l.Close() // the policy takes hold: connections are refused
	deadline := time.Now().Add(5 * time.Second)
	for !c.Enforced() {
		if time.Now().After(deadline) {
			t.Fatal("not ready after the canary address was blocked")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(gaveUp) != 0 {
		t.Fatal("gave up")
	}
}

func TestCanaryGivesUpWithAMessage(t *testing.T) {
	l := reachable(t)
	gaveUp := make(chan string, 1)
	c := Start(context.Background(), l.Addr().String(), 500*time.Millisecond, testr.New(t), func(m string) { gaveUp <- m })
	select {
	case m := <-gaveUp:
		if c.Enforced() {
			t.Fatal("enforced and gave up")
		}
		t.Log(m)
	case <-time.After(5 * time.Second):
		t.Fatal("did not give up")
	}
}

func TestNoCanaryIsReadyAtOnce(t *testing.T) {
	if !Start(context.Background(), "", time.Minute, testr.New(t), nil).Enforced() {
		t.Fatal("no canary: nothing to wait for")
	}
}
