package server

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// A variable too large to return is a 413 that says the limit.
func TestHugeVariableIs413(t *testing.T) {
	a := startAgent(t, 1)
	if _, err := a.c.Execute(context.Background(), protocol.ExecuteRequest{Code: "big = ['x' * 1000] * 20000"}); err != nil {
		t.Fatal(err)
	}
	code, msg := raw(t, "GET", a.url+"/v1/variables/big", "Bearer "+token, "")
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "larger than 4194304 bytes") {
		t.Fatalf("got %d %.200q", code, msg)
	}
}
