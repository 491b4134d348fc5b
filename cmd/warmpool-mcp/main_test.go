package main

import (
	"strings"
	"testing"
)

// Attack surface of the HTTP setup: the server's own rights or callers'
// tokens must not be offered to the network.
func TestCheckListenRefusesSetupsThatLeakCredentials(t *testing.T) {
	for _, tc := range []struct {
		addr          string
		own           bool
		cert, key     string
		wantErrSubstr string
	}{
		{addr: "127.0.0.1:8080"},
		{addr: "[::1]:8080", own: true},
		{addr: "localhost:8080", own: true},
		{addr: "0.0.0.0:8080", wantErrSubstr: "serve TLS"},
		{addr: ":8080", wantErrSubstr: "serve TLS"},
		{addr: "0.0.0.0:8080", cert: "c.pem", key: "k.pem"},
		{addr: "0.0.0.0:8080", own: true, cert: "c.pem", key: "k.pem", wantErrSubstr: "with this server's rights"},
		{addr: "127.0.0.1:8080", cert: "c.pem", wantErrSubstr: "go together"},
	} {
		err := checkListen(tc.addr, tc.own, tc.cert, tc.key)
		switch {
		case tc.wantErrSubstr == "" && err != nil:
			t.Errorf("%+v: refused: %v", tc, err)
		case tc.wantErrSubstr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErrSubstr)):
			t.Errorf("%+v: got %v, want an error saying %q", tc, err, tc.wantErrSubstr)
		}
	}
}
