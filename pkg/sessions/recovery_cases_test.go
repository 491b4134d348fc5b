package sessions

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warmpool/warmpool/internal/testing/scriptedplane"
)

// The golden cases of the lost-answer recovery (docs/recovery.md), which the
// Python and TypeScript clients run too.
func TestRecoveryCases(t *testing.T) {
	cases, err := scriptedplane.Cases("../protocol/testdata/recovery.json")
	if err != nil {
		t.Fatal(err)
	}
	plane := &scriptedplane.Plane{Namespace: "ns", Session: "s"}
	srv := httptest.NewServer(plane)
	defer srv.Close()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			script, _ := json.Marshal(c.Exchanges)
			resp, err := http.Post(srv.URL+"/_script", "application/json", bytes.NewReader(script))
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("load the script: %v %v", err, resp)
			}
			_ = resp.Body.Close()

			s := (&Client{}).WithDataPlane(srv.URL, srv.Client()).Open("ns", "s")
			var handed strings.Builder
			res, err := s.RunStream(context.Background(), ExecRequest{Code: "x"},
				Handlers{OnStdout: func(d string) { handed.WriteString(d) }})
			got := outcome(res, err, handed.String())
			if got != c.Outcome {
				t.Errorf("outcome %+v (err %v), want %+v", got, err, c.Outcome)
			}
			var v struct{ Problems, Requests []string }
			resp, err = http.Get(srv.URL + "/_verdict")
			if err != nil {
				t.Fatal(err)
			}
			_ = json.NewDecoder(resp.Body).Decode(&v)
			_ = resp.Body.Close()
			if len(v.Problems) > 0 {
				t.Errorf("the plane saw %v: %v", v.Requests, v.Problems)
			}
		})
	}
}

// outcome is how the Go client's answer reads in the cases' terms.
func outcome(res *Result, err error, handed string) scriptedplane.Outcome {
	var notRun *NotRunError
	var apiErr *Error
	switch {
	case errors.As(err, &notRun):
		return scriptedplane.Outcome{Error: "not_run"}
	case errors.As(err, &apiErr):
		return scriptedplane.Outcome{Error: "status", Code: apiErr.Code}
	case err != nil:
		return scriptedplane.Outcome{Error: err.Error()}
	case res.StateLost:
		return scriptedplane.Outcome{Error: "state_lost"}
	}
	o := scriptedplane.Outcome{Status: string(res.Status), Stdout: res.Stdout, HandedStdout: handed}
	if res.Result != nil {
		o.Result = *res.Result
	}
	return o
}
