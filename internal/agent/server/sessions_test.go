package server

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/warmpool/warmpool/internal/agent/client"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// Sessions never share an interpreter: with every interpreter bound to a
// session, a new session (or a run without one) is refused instead of running
// on another session's state; resetting a session frees its interpreter.
func TestSessionsNeverShareAnInterpreter(t *testing.T) {
	a := startAgent(t, 2)
	ctx := context.Background()
	auth := "Bearer " + token
	result := func(session, code string) string {
		t.Helper()
		res, err := a.c.Execute(ctx, protocol.ExecuteRequest{Session: session, Code: code})
		if err != nil || res.Status != protocol.StatusSucceeded || res.Result == nil {
			t.Fatalf("session %q, %q: %+v %v", session, code, res, err)
		}
		return *res.Result
	}
	// A run without a session leaves state behind; sessions do not see it.
	result("", "leak = 'no session'\nTrue")
	if got := result("alice", "who = 'alice'\n'leak' in globals()"); got != "False" {
		t.Fatalf("alice sees state of a run without a session: %s", got)
	}
	if got := result("bob", "who = 'bob'\n'leak' in globals()"); got != "False" {
		t.Fatalf("bob sees state of a run without a session: %s", got)
	}
	// Both interpreters are bound now.
	_, err := a.c.Execute(ctx, protocol.ExecuteRequest{Session: "carol", Code: "'who' in globals()"})
	if !client.IsStatus(err, http.StatusConflict) || !strings.Contains(err.Error(), "all 2 interpreters are bound to other sessions") {
		t.Fatalf("carol: err = %v, want 409", err)
	}
	_, err = a.c.Execute(ctx, protocol.ExecuteRequest{Code: "who"})
	if !client.IsStatus(err, http.StatusConflict) || !strings.Contains(err.Error(), "bound to sessions") {
		t.Fatalf("no session: err = %v, want 409", err)
	}
	if code, msg := raw(t, "GET", a.url+"/v1/variables/who?session=carol", auth, ""); code != 404 || !strings.Contains(msg, `no session "carol"`) {
		t.Fatalf("variable of an unknown session: %d %q", code, msg)
	}
	if code, msg := raw(t, "POST", a.url+protocol.PathReset+"?session=carol", auth, ""); code != 404 || !strings.Contains(msg, `no session "carol"`) {
		t.Fatalf("reset of an unknown session: %d %q", code, msg)
	}
	if got := result("alice", "who"); got != "'alice'" {
		t.Fatalf("alice: %s", got)
	}
	// Resetting alice frees her interpreter: carol gets it, fresh.
	if code, _ := raw(t, "POST", a.url+protocol.PathReset+"?session=alice", auth, ""); code != 200 {
		t.Fatalf("reset alice: %d", code)
	}
	if got := result("carol", "'who' in globals()"); got != "False" {
		t.Fatalf("carol sees another session's state: %s", got)
	}
	if got := result("bob", "who"); got != "'bob'" {
		t.Fatalf("bob: %s", got)
	}
}
