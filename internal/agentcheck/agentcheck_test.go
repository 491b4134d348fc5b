package agentcheck

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/protocol"
)

func readyPod(name string) *corev1.Pod {
	p := wrappers.Pod("ns", name, "python").Obj()
	p.UID = types.UID("uid-" + name)
	p.Status.PodIP = "10.0.0.1"
	return p
}

// A pod is usable only once its agent said it speaks a supported protocol;
// the question is asked once, in the background, and its answer told.
func TestUsableOnlyOnceTheAgentSaidItSpeaksTheProtocol(t *testing.T) {
	answers := map[string]*protocol.Health{
		"uid-old":    {OK: true}, // predates versions: speaks 1
		"uid-now":    {OK: true, Protocol: protocol.Version, Agent: "v0.2.0"},
		"uid-future": {OK: true, Protocol: protocol.Version + 1, Agent: "v9.0.0"},
		"uid-long":   {OK: true, Protocol: protocol.Version, Agent: strings.Repeat("x", 300)},
	}
	var asked atomic.Int32
	learned := make(chan string, 10)
	c := New(func(_ context.Context, p *corev1.Pod) (*protocol.Health, error) {
		asked.Add(1)
		return answers[string(p.UID)], nil
	}, func(p *corev1.Pod) { learned <- p.Name })

	for _, name := range []string{"old", "now", "future", "long"} {
		p := readyPod(name)
		if !c.Usable(p) {
			t.Fatalf("%s: not usable before its agent answered: its claim asks it (Check)", name)
		}
		select {
		case got := <-learned:
			if got != name {
				t.Fatalf("learned %s, want %s", got, name)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: never learned", name)
		}
	}
	for name, want := range map[string]bool{"old": true, "now": true, "future": false} {
		if got := c.Usable(readyPod(name)); got != want {
			t.Errorf("%s: usable %v, want %v", name, got, want)
		}
	}
	if i, _ := c.Lookup("uid-old"); i.Build != UnknownBuild || i.Protocol != 1 || !i.Supported {
		t.Errorf("an agent that predates versions: %+v", i)
	}
	if i, _ := c.Lookup("uid-future"); i.Build != "v9.0.0" || i.Protocol != protocol.Version+1 || i.Supported {
		t.Errorf("a newer agent: %+v", i)
	}
	if i, _ := c.Lookup("uid-long"); len(i.Build) != 128 {
		t.Errorf("a build name of 300 characters kept as %d, want status.agents' 128", len(i.Build))
	}
	if n := asked.Load(); n != 4 {
		t.Errorf("asked %d times, want once per pod", n)
	}
	c.Forget("uid-now")
	if _, ok := c.Lookup("uid-now"); ok {
		t.Error("a forgotten pod is still known")
	}
}

// A pod that is not Ready, or has no address, is not asked; one that does
// not answer is asked again.
func TestAsksOnlyReadyPodsAndRetries(t *testing.T) {
	var asked atomic.Int32
	learned := make(chan struct{}, 1)
	c := New(func(context.Context, *corev1.Pod) (*protocol.Health, error) {
		if asked.Add(1) < 2 {
			return nil, errors.New("connection refused")
		}
		return &protocol.Health{OK: true, Protocol: protocol.Version}, nil
	}, func(*corev1.Pod) { learned <- struct{}{} })
	notReady := wrappers.Pod("ns", "starting", "python").NotReady().Obj()
	notReady.Status.PodIP = "10.0.0.2"
	c.Usable(notReady)
	noIP := readyPod("noip")
	noIP.Status.PodIP = ""
	c.Usable(noIP)
	time.Sleep(50 * time.Millisecond)
	if n := asked.Load(); n != 0 {
		t.Fatalf("asked %d pods that cannot answer", n)
	}
	p := readyPod("p")
	c.Usable(p)
	c.Usable(p) // asked once at a time
	select {
	case <-learned:
	case <-time.After(5 * time.Second):
		t.Fatal("never learned after a failed question")
	}
	if !c.Usable(p) || asked.Load() != 2 {
		t.Fatalf("usable %v after %d questions, want true after 2", c.Usable(p), asked.Load())
	}
}

// A claim asks a pod whose answer is not in yet, and refuses an agent of
// another protocol with the versions in its words.
func TestCheckAsksBeforeTheFirstClaim(t *testing.T) {
	var asked atomic.Int32
	learned := make(chan string, 4)
	c := New(func(_ context.Context, p *corev1.Pod) (*protocol.Health, error) {
		asked.Add(1)
		if p.Name == "future" {
			return &protocol.Health{OK: true, Protocol: protocol.Version + 1, Agent: "v9.0.0"}, nil
		}
		return &protocol.Health{OK: true, Protocol: protocol.Version}, nil
	}, func(p *corev1.Pod) { learned <- p.Name })
	now := readyPod("now")
	now.Status.Conditions = nil // not Ready: Usable does not ask it
	if err := c.Check(context.Background(), now); err != nil {
		t.Fatalf("a current agent: %v", err)
	}
	if err := c.Check(context.Background(), now); err != nil || asked.Load() != 1 {
		t.Fatalf("asked again (%d) or refused (%v) once known", asked.Load(), err)
	}
	err := c.Check(context.Background(), readyPod("future"))
	var unsupported *UnsupportedError
	if !errors.As(err, &unsupported) || !strings.Contains(err.Error(), "build v9.0.0") ||
		!strings.Contains(err.Error(), fmt.Sprintf("speaks protocol %d", protocol.Version+1)) {
		t.Fatalf("a newer agent: %v", err)
	}
	if c.Usable(readyPod("future")) {
		t.Fatal("a pod whose agent a claim found unsupported is still usable")
	}
	for range 2 {
		select {
		case <-learned:
		case <-time.After(5 * time.Second):
			t.Fatal("the answers to Check were not told")
		}
	}
}
