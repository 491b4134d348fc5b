package fleet

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentclient "github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/internal/agentauth"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// agentOf starts the fleet's agent for a pod and returns the manager's
// client of it (a token signed for the pod) and one signed for another pod.
func agentOf(t *testing.T) (*agentclient.Client, *agentclient.Client, *Fleet) {
	c, other, f, _ := agentAndToken(t)
	return c, other, f
}

func agentAndToken(t *testing.T) (*agentclient.Client, *agentclient.Client, *Fleet, string) {
	t.Helper()
	keys, err := agentauth.ParseKeyring(map[string][]byte{agentauth.CurrentKey: []byte("k1"), "k1": agentauth.NewSeed()})
	if err != nil {
		t.Fatal(err)
	}
	keyID, trusted := keys.Current()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	f := New(port)
	t.Cleanup(f.Stop)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-1"},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Args: []string{"--port", "8080", "--trusted-keys", trusted}}}},
		Status: corev1.PodStatus{PodIP: "127.0.0.1"}}
	if err := f.Sync(pod, false); err != nil {
		t.Fatal(err)
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	token := func(uid string) string {
		tok, err := keys.Token(uid, keyID)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	return agentclient.New(url, token("uid-1")), agentclient.New(url, token("uid-2")), f, token("uid-1")
}

func TestAgentRunsOnceByID(t *testing.T) {
	c, _, f := agentOf(t)
	ctx := context.Background()
	req := protocol.ExecuteRequest{ID: "run-1", Code: "print('hello')\n42"}
	res, err := c.Execute(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != protocol.StatusSucceeded || res.Stdout != "hello\n" || res.Result == nil || *res.Result != "42" {
		t.Fatalf("result %+v", res)
	}
	again, err := c.Execute(ctx, protocol.ExecuteRequest{ID: "run-1", Code: "print('other')\n7"})
	if err != nil {
		t.Fatal(err)
	}
	if again.Stdout != "hello\n" || *again.Result != "42" {
		t.Fatalf("the same ID ran again: %+v", again)
	}
	h, err := c.Ready(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.Runs != 1 || h.Busy != 0 || h.Interpreter != res.Interpreter {
		t.Fatalf("health %+v after one run on %s", h, res.Interpreter)
	}
	if got := f.Requests()["POST "+protocol.PathExecute]; got != 2 {
		t.Fatalf("counted %d execute calls, want 2", got)
	}
}

func TestAgentRefusesAnotherPodsToken(t *testing.T) {
	_, other, _ := agentOf(t)
	_, err := other.Execute(context.Background(), protocol.ExecuteRequest{ID: "x", Code: "1"})
	if !agentclient.IsStatus(err, http.StatusUnauthorized) {
		t.Fatalf("a token for another pod: %v, want 401", err)
	}
}

func TestAgentStreamsAndInterrupts(t *testing.T) {
	c, _, _ := agentOf(t)
	ctx := context.Background()
	done := make(chan *protocol.Result, 1)
	go func() {
		res, _ := c.ExecuteStream(ctx, protocol.ExecuteRequest{ID: "long", Code: "print('a')\nsleep(30)\n1"}, func(protocol.Event) {})
		done <- res
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		info, err := c.Execution(ctx, "long")
		if err == nil && info.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run never showed as running: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.Execute(ctx, protocol.ExecuteRequest{ID: "second", Code: "1"}); !agentclient.IsStatus(err, http.StatusConflict) {
		t.Fatalf("a second run while one runs: %v, want 409", err)
	}
	if err := c.Interrupt(ctx, "long"); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res == nil || res.Status != protocol.StatusInterrupted || res.Stdout != "a\n" {
			t.Fatalf("interrupted run: %+v", res)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the interrupt did not end the run")
	}
}

func TestAgentResetReplacesTheInterpreter(t *testing.T) {
	c, _, _ := agentOf(t)
	ctx := context.Background()
	first, err := c.Execute(ctx, protocol.ExecuteRequest{ID: "a", Code: "1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := c.Execute(ctx, protocol.ExecuteRequest{ID: "b", Code: "2", Interpreter: first.Interpreter})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != protocol.StatusFailed || res.Error == nil || res.Error.Type != protocol.ErrorInterpreterRestarted {
		t.Fatalf("a run naming the replaced interpreter: %+v", res)
	}
}

// kwok may give a pod a second IP when its stages run behind: the agent
// follows the pod there, with its runs, and no longer answers at the old one.
func TestAgentFollowsItsPodToANewIP(t *testing.T) {
	c, _, f, tok := agentAndToken(t)
	ctx := context.Background()
	if _, err := c.Execute(ctx, protocol.ExecuteRequest{ID: "before", Code: "7"}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-1"}, Status: corev1.PodStatus{PodIP: "127.0.0.2"}}
	if err := f.Sync(pod, false); err != nil {
		t.Fatal(err)
	}
	moved := agentclient.New("http://127.0.0.2:"+strconv.Itoa(f.Port), tok)
	info, err := moved.Execution(ctx, "before")
	if err != nil || info.Result == nil || *info.Result.Result != "7" {
		t.Fatalf("the run before the move, asked at the new IP: %+v, %v", info, err)
	}
	if _, err := c.Ready(ctx); err == nil {
		t.Fatal("the agent still answers at the pod's old IP")
	}
}
