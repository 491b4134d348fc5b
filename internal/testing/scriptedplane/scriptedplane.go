// Package scriptedplane is a data plane that answers from a script: the
// golden cases of the clients' lost-answer recovery
// (pkg/protocol/testdata/recovery.json, docs/recovery.md). The Go, Python
// and TypeScript clients all run those cases against it, so they are held to
// one behaviour. A test loads a case's exchanges (PUT /_script), runs the
// client, and asks for the verdict (GET /_verdict): whether the requests came
// in the scripted order, all for one run ID.
package scriptedplane

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
)

// Case is one golden case.
type Case struct {
	Name      string     `json:"name"`
	Exchanges []Exchange `json:"exchanges"`
	Outcome   Outcome    `json:"outcome"`
}

// Exchange is one scripted answer: to a request that matches Expect
// ("POST exec", "GET executions").
type Exchange struct {
	Expect string `json:"expect"`
	// Repeat answers every matching request until one matches the next exchange.
	Repeat bool `json:"repeat,omitempty"`
	// An error Status...
	Status  int    `json:"status,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// ...or a JSON body (200)...
	JSON json.RawMessage `json:"json,omitempty"`
	// ...or a stream of events (200, NDJSON), Cut off mid-line at its end.
	Stream []json.RawMessage `json:"stream,omitempty"`
	Cut    bool              `json:"cut,omitempty"`
}

// Outcome is what the client must end with: a result (Status, Stdout,
// Result, and HandedStdout: all its on_stdout handler was given), or an
// Error: "not_run", "status" (with Code) or "state_lost".
type Outcome struct {
	Status       string `json:"status,omitempty"`
	Stdout       string `json:"stdout,omitempty"`
	Result       string `json:"result,omitempty"`
	HandedStdout string `json:"handedStdout,omitempty"`
	Error        string `json:"error,omitempty"`
	Code         int    `json:"code,omitempty"`
}

// Cases reads the golden cases.
func Cases(path string) ([]Case, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Cases []Case `json:"cases"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return doc.Cases, nil
}

// Plane serves the data plane of Session Namespace/Session from a script.
type Plane struct {
	Namespace, Session string

	mu       sync.Mutex
	script   []Exchange
	next     int
	runID    string
	problems []string
	requests []string
}

const prefix = "/apis/data.warmpool.dev/v1alpha1/namespaces/"

// ServeHTTP implements http.Handler.
func (p *Plane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/_script":
		var ex []Exchange
		if err := json.NewDecoder(r.Body).Decode(&ex); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		p.script, p.next, p.runID, p.problems, p.requests = ex, 0, "", nil, nil
		p.mu.Unlock()
		return
	case "/_verdict":
		p.mu.Lock()
		v := map[string]any{"problems": p.problems, "requests": p.requests}
		if p.next < len(p.script) && !(p.next == len(p.script)-1 && p.script[p.next].Repeat) {
			v["problems"] = append(append([]string(nil), p.problems...),
				fmt.Sprintf("the client stopped after %d of %d exchanges", p.next, len(p.script)))
		}
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
		return
	}
	base := prefix + p.Namespace + "/sessions/" + p.Session + "/"
	if !strings.HasPrefix(r.URL.Path, base) {
		p.problem(w, fmt.Sprintf("unexpected request %s %s", r.Method, r.URL.Path))
		return
	}
	req := r.Method + " " + strings.TrimPrefix(r.URL.Path, base)
	id := r.URL.Query().Get("id")
	if r.Method == http.MethodPost {
		var body struct {
			ID string `json:"id"`
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &body)
		id = body.ID
	}
	ex, ok := p.take(req, id)
	if !ok {
		p.problem(w, fmt.Sprintf("unexpected request %s (id %q)", req, id))
		return
	}
	p.answer(w, ex)
}

// take returns the exchange that answers req, checking the run ID.
func (p *Plane) take(req, id string) (Exchange, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests = append(p.requests, req)
	if id == "" {
		p.problems = append(p.problems, req+" names no run ID")
	} else if p.runID == "" {
		p.runID = id
	} else if id != p.runID {
		p.problems = append(p.problems, fmt.Sprintf("%s is for run %q, not the run %q", req, id, p.runID))
	}
	for p.next < len(p.script) {
		ex := p.script[p.next]
		if ex.Expect == req {
			if !ex.Repeat {
				p.next++
			}
			return ex, true
		}
		if !ex.Repeat {
			break
		}
		p.next++ // a repeat ends at the first request it does not match
	}
	return Exchange{}, false
}

func (p *Plane) problem(w http.ResponseWriter, msg string) {
	p.mu.Lock()
	p.problems = append(p.problems, msg)
	p.mu.Unlock()
	writeStatus(w, http.StatusTeapot, "Unscripted", msg)
}

func (p *Plane) answer(w http.ResponseWriter, ex Exchange) {
	switch {
	case ex.Status != 0:
		writeStatus(w, ex.Status, ex.Reason, ex.Message)
	case ex.JSON != nil:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(ex.JSON)
	default:
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		for _, ev := range ex.Stream {
			_, _ = w.Write(append(append([]byte(nil), ev...), '\n'))
		}
		if !ex.Cut {
			return
		}
		// Half a line, then the connection goes: no chunked trailer, no
		// clean end, as when a replica stops mid-stream.
		_, _ = io.WriteString(w, `{"type":"std`)
		w.(http.Flusher).Flush()
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close()
		}
	}
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure",
		"reason": reason, "message": msg, "code": code})
}
