// Package fakellm is a small OpenAI-compatible chat-completions server for
// tests: it answers "MODEL says: PROMPT" deterministically, reports token
// usage, and records every request it got (with its Authorization header).
package fakellm

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
)

// Request is what one call sent.
type Request struct {
	Model         string
	Prompt        string
	MaxTokens     int
	Authorization string
}

// Server is a running fake endpoint.
type Server struct {
	*httptest.Server
	// Respond, when set, answers a request instead of the default echo; it
	// is called after the request was recorded.
	Respond func(w http.ResponseWriter, r Request)

	mu       sync.Mutex
	requests []Request
}

// Start serves on addr ("" for a loopback port). Close stops it.
func Start(addr string) (*Server, error) {
	s := &Server{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	if addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, err
		}
		_ = s.Listener.Close()
		s.Listener = ln
	}
	s.Start()
	return s, nil
}

// Endpoint is the chat-completions URL.
func (s *Server) Endpoint() string { return s.URL + "/v1/chat/completions" }

// Requests returns the requests so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Model     string `json:"model"`
		MaxTokens int    `json:"max_tokens"`
		Messages  []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || len(body.Messages) == 0 {
		http.Error(w, `{"error":{"message":"bad request: no messages"}}`, http.StatusBadRequest)
		return
	}
	req := Request{Model: body.Model, Prompt: body.Messages[0].Content, MaxTokens: body.MaxTokens,
		Authorization: r.Header.Get("Authorization")}
	s.mu.Lock()
	s.requests = append(s.requests, req)
	s.mu.Unlock()
	if s.Respond != nil {
		s.Respond(w, req)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
			"message": map[string]any{"role": "assistant", "content": req.Model + " says: " + req.Prompt}}},
		"usage": map[string]any{"prompt_tokens": len(req.Prompt), "completion_tokens": len(req.Model) + 6 + len(req.Prompt)},
	})
}
